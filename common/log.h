// Logging to stderr, filtered by Config::log_level. Log an error once, where
// it is first understood; the data path never logs per op.
#pragma once

#include <string_view>

#include "rdmabuf/config.h"

namespace rdmabuf {

// Process-wide threshold; the manager created last sets it.
void set_log_level(LogLevel level);
bool log_enabled(LogLevel level);
// Writes "rdmabuf[PID] LEVEL: message\n" to stderr as one write.
void log_message(LogLevel level, std::string_view message);

#define RDMABUF_LOG(level, message)                                              \
  do {                                                                           \
    if (::rdmabuf::log_enabled(level)) ::rdmabuf::log_message(level, (message)); \
  } while (0)
#define RDMABUF_LOG_ERROR(message) RDMABUF_LOG(::rdmabuf::LogLevel::kError, message)
#define RDMABUF_LOG_WARN(message) RDMABUF_LOG(::rdmabuf::LogLevel::kWarn, message)
#define RDMABUF_LOG_INFO(message) RDMABUF_LOG(::rdmabuf::LogLevel::kInfo, message)
#define RDMABUF_LOG_DEBUG(message) RDMABUF_LOG(::rdmabuf::LogLevel::kDebug, message)

}  // namespace rdmabuf
