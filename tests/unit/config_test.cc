// Config: defaults, Config::from_env (every RDMABUF_* variable), validate(),
// describe(), and parse_size.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "rdmabuf/config.h"
#include "rdmabuf/manager.h"
#include "tests/helpers/printers.h"

extern char** environ;

namespace rdmabuf {
namespace {

// Clears every RDMABUF_* variable for the test's duration and restores the
// environment afterwards.
class ScopedEnv {
 public:
  ScopedEnv() {
    for (char** e = environ; *e; ++e) {
      std::string entry(*e);
      if (entry.rfind("RDMABUF_", 0) != 0) continue;
      size_t eq = entry.find('=');
      saved_[entry.substr(0, eq)] = entry.substr(eq + 1);
    }
    for (const auto& [name, value] : saved_)
      ::unsetenv(name.c_str());
  }
  ~ScopedEnv() {
    for (const auto& name : touched_)
      ::unsetenv(name.c_str());
    for (const auto& [name, value] : saved_)
      ::setenv(name.c_str(), value.c_str(), 1);
  }
  void set(const std::string& name, const std::string& value) {
    touched_.push_back(name);
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  void unset(const std::string& name) { ::unsetenv(name.c_str()); }

 private:
  std::map<std::string, std::string> saved_;
  std::vector<std::string> touched_;
};

TEST(ConfigTest, DefaultsAreValid) {
  Config c;
  EXPECT_TRUE(c.validate().ok()) << c.validate().to_string();
  EXPECT_EQ(c.listen_address, "127.0.0.1:0");
  EXPECT_TRUE(c.advertise_host.empty());
  EXPECT_TRUE(c.backends.empty());
  EXPECT_TRUE(c.allow_tcp_fallback);
  EXPECT_EQ(c.tcp_streams, 4);
  EXPECT_EQ(c.chunk_size, size_t{1} << 20);
  EXPECT_EQ(c.busy_poll, std::chrono::microseconds(200));
  EXPECT_EQ(c.default_timeout, std::chrono::milliseconds(30000));
  EXPECT_EQ(c.io_stall_timeout, std::chrono::milliseconds(30000));
  EXPECT_EQ(c.max_connections, 0);
  EXPECT_EQ(c.io_threads, 0);
  EXPECT_EQ(c.log_level, LogLevel::kWarn);
}

TEST(ConfigTest, FromEnvWithNothingSetGivesDefaults) {
  ScopedEnv env;
  auto c = Config::from_env();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  Config d;
  EXPECT_EQ(c->listen_address, d.listen_address);
  EXPECT_EQ(c->tcp_streams, d.tcp_streams);
  EXPECT_EQ(c->chunk_size, d.chunk_size);
  EXPECT_EQ(c->max_connections, d.max_connections);
}

TEST(ConfigTest, FromEnvReadsEveryVariable) {
  ScopedEnv env;
  env.set("RDMABUF_LISTEN", "0.0.0.0:4567");
  env.set("RDMABUF_ADVERTISE_HOST", "10.1.2.3");
  env.set("RDMABUF_BACKENDS", " tcp , memory,,");
  env.set("RDMABUF_ALLOW_TCP_FALLBACK", "0");
  env.set("RDMABUF_TCP_STREAMS", "7");
  env.set("RDMABUF_CHUNK_SIZE", "64K");
  env.set("RDMABUF_BUSY_POLL_US", "0");
  env.set("RDMABUF_TIMEOUT_MS", "1234");
  env.set("RDMABUF_IO_STALL_TIMEOUT_MS", "250");
  env.set("RDMABUF_MAX_CONNECTIONS", "3");
  env.set("RDMABUF_IO_THREADS", "5");
  env.set("RDMABUF_LEND_LIMIT", "16M");
  env.set("RDMABUF_MAX_LEASE_MS", "5000");
  env.set("RDMABUF_LOG_LEVEL", "debug");
  auto c = Config::from_env();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->listen_address, "0.0.0.0:4567");
  EXPECT_EQ(c->advertise_host, "10.1.2.3");
  EXPECT_EQ(c->backends, (std::vector<std::string>{"tcp", "memory"}));
  EXPECT_FALSE(c->allow_tcp_fallback);
  EXPECT_EQ(c->tcp_streams, 7);
  EXPECT_EQ(c->chunk_size, 64u << 10);
  EXPECT_EQ(c->busy_poll, std::chrono::microseconds(0));
  EXPECT_EQ(c->default_timeout, std::chrono::milliseconds(1234));
  EXPECT_EQ(c->io_stall_timeout, std::chrono::milliseconds(250));
  EXPECT_EQ(c->max_connections, 3);
  EXPECT_EQ(c->io_threads, 5);
  EXPECT_EQ(c->lend_limit, 16u << 20);
  EXPECT_EQ(c->max_lease, std::chrono::milliseconds(5000));
  EXPECT_EQ(c->log_level, LogLevel::kDebug);
}

TEST(ConfigTest, FromEnvBooleansAndLogLevels) {
  ScopedEnv env;
  for (const char* yes : {"1", "true", "YES", "on", " True "}) {
    env.set("RDMABUF_ALLOW_TCP_FALLBACK", yes);
    auto c = Config::from_env();
    ASSERT_TRUE(c.ok()) << yes;
    EXPECT_TRUE(c->allow_tcp_fallback) << yes;
  }
  for (const char* no : {"0", "false", "No", "OFF"}) {
    env.set("RDMABUF_ALLOW_TCP_FALLBACK", no);
    auto c = Config::from_env();
    ASSERT_TRUE(c.ok()) << no;
    EXPECT_FALSE(c->allow_tcp_fallback) << no;
  }
  env.unset("RDMABUF_ALLOW_TCP_FALLBACK");
  const std::pair<const char*, LogLevel> levels[] = {{"error", LogLevel::kError},
                                                     {"warn", LogLevel::kWarn},
                                                     {"warning", LogLevel::kWarn},
                                                     {"info", LogLevel::kInfo},
                                                     {"debug", LogLevel::kDebug}};
  for (const auto& [text, level] : levels) {
    env.set("RDMABUF_LOG_LEVEL", text);
    auto c = Config::from_env();
    ASSERT_TRUE(c.ok()) << text;
    EXPECT_EQ(c->log_level, level) << text;
  }
}

TEST(ConfigTest, FromEnvEmptyValueMeansUnset) {
  ScopedEnv env;
  env.set("RDMABUF_TCP_STREAMS", "");
  env.set("RDMABUF_LISTEN", "");
  auto c = Config::from_env();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->tcp_streams, 4);
  EXPECT_EQ(c->listen_address, "127.0.0.1:0");
}

struct BadValue {
  const char* variable;
  const char* value;
};

// Values no parser accepts: each must be InvalidArgument naming the variable.
const BadValue kUnparsable[] = {
    {"RDMABUF_ALLOW_TCP_FALLBACK", "maybe"},
    {"RDMABUF_ALLOW_TCP_FALLBACK", "2"},
    {"RDMABUF_TCP_STREAMS", "many"},
    {"RDMABUF_TCP_STREAMS", "0"},
    {"RDMABUF_TCP_STREAMS", "65"},
    {"RDMABUF_TCP_STREAMS", "-1"},
    {"RDMABUF_TCP_STREAMS", "2x"},
    {"RDMABUF_CHUNK_SIZE", "big"},
    {"RDMABUF_CHUNK_SIZE", "1.5M"},
    {"RDMABUF_CHUNK_SIZE", "-4K"},
    {"RDMABUF_CHUNK_SIZE", "4T"},
    {"RDMABUF_BUSY_POLL_US", "-1"},
    {"RDMABUF_BUSY_POLL_US", "fast"},
    {"RDMABUF_BUSY_POLL_US", "10000001"},
    {"RDMABUF_TIMEOUT_MS", "0"},
    {"RDMABUF_TIMEOUT_MS", "-5"},
    {"RDMABUF_TIMEOUT_MS", "1s"},
    {"RDMABUF_IO_STALL_TIMEOUT_MS", "0"},
    {"RDMABUF_IO_STALL_TIMEOUT_MS", "soon"},
    {"RDMABUF_MAX_CONNECTIONS", "-1"},
    {"RDMABUF_IO_THREADS", "-2"},
    {"RDMABUF_IO_THREADS", "1025"},
    {"RDMABUF_MAX_CONNECTIONS", "lots"},
    {"RDMABUF_LEND_LIMIT", "plenty"},
    {"RDMABUF_MAX_LEASE_MS", "0"},
    {"RDMABUF_LOG_LEVEL", "verbose"},
    {"RDMABUF_LOG_LEVEL", "3"},
};

TEST(ConfigTest, FromEnvUnparsableValuesNameTheVariable) {
  for (const BadValue& bad : kUnparsable) {
    ScopedEnv env;
    env.set(bad.variable, bad.value);
    auto c = Config::from_env();
    ASSERT_FALSE(c.ok()) << bad.variable << "=" << bad.value << " was accepted";
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status().to_string();
    EXPECT_NE(c.status().message().find(bad.variable), std::string::npos)
        << bad.variable << "=" << bad.value << ": " << c.status().to_string();
  }
}

// Values that parse but that validate() refuses. The contract says "an
// unparsable value is kInvalidArgument naming the variable"; these are
// parsable but still bad, and a user who set them in the environment has to
// be told which variable to fix.
// Regression: a bug this suite found at 1bfea06 (fixed in the working tree:
// validate() names the variable too). These reached the user as "config
// chunk_size=1024: must be in 4 KiB..1 GiB", naming the field only.
const BadValue kOutOfRange[] = {
    {"RDMABUF_CHUNK_SIZE", "1K"},
    {"RDMABUF_CHUNK_SIZE", "2G"},
    {"RDMABUF_LISTEN", "nowhere"},
    {"RDMABUF_LISTEN", "127.0.0.1:99999"},
};

TEST(ConfigTest, FromEnvOutOfRangeValuesNameTheVariable) {
  for (const BadValue& bad : kOutOfRange) {
    ScopedEnv env;
    env.set(bad.variable, bad.value);
    auto c = Config::from_env();
    ASSERT_FALSE(c.ok()) << bad.variable << "=" << bad.value << " was accepted";
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status().to_string();
    EXPECT_NE(c.status().message().find(bad.variable), std::string::npos)
        << bad.variable << "=" << bad.value << ": " << c.status().to_string();
  }
}

TEST(ConfigTest, ManagerCreateFromEnvRefusesBadEnvironment) {
  ScopedEnv env;
  env.set("RDMABUF_TCP_STREAMS", "0");
  auto m = Manager::create();
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("RDMABUF_TCP_STREAMS"), std::string::npos);
}

TEST(ConfigTest, ManagerCreateRefusesUnknownBackend) {
  ScopedEnv env;
  env.set("RDMABUF_BACKENDS", "tcp,bogus");
  auto m = Manager::create();
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("bogus"), std::string::npos) << m.status().to_string();
}

TEST(ConfigTest, ManagerCreateFromEnvUsesTheEnvironment) {
  ScopedEnv env;
  env.set("RDMABUF_TCP_STREAMS", "3");
  env.set("RDMABUF_CHUNK_SIZE", "128K");
  auto m = Manager::create();
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)->config().tcp_streams, 3);
  EXPECT_EQ((*m)->config().chunk_size, 128u << 10);
}

TEST(ConfigTest, ValidateNamesTheField) {
  struct Case {
    const char* field;
    void (*mutate)(Config&);
  };
  const Case cases[] = {
      {"listen_address", [](Config& c) { c.listen_address = "no-port"; }},
      {"listen_address", [](Config& c) { c.listen_address = ":80"; }},
      {"tcp_streams", [](Config& c) { c.tcp_streams = 0; }},
      {"tcp_streams", [](Config& c) { c.tcp_streams = 65; }},
      {"chunk_size", [](Config& c) { c.chunk_size = 4095; }},
      {"chunk_size", [](Config& c) { c.chunk_size = (size_t{1} << 30) + 1; }},
      {"busy_poll", [](Config& c) { c.busy_poll = std::chrono::microseconds(-1); }},
      {"default_timeout", [](Config& c) { c.default_timeout = std::chrono::milliseconds(0); }},
      {"io_stall_timeout", [](Config& c) { c.io_stall_timeout = std::chrono::milliseconds(-1); }},
      {"max_connections", [](Config& c) { c.max_connections = -1; }},
      {"io_threads", [](Config& c) { c.io_threads = -1; }},
  };
  for (const Case& k : cases) {
    Config c;
    k.mutate(c);
    Status s = c.validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << k.field;
    EXPECT_NE(s.message().find(k.field), std::string::npos) << s.to_string();
    auto m = Manager::create(c);
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << k.field;
  }
  Config edge;
  edge.chunk_size = 4096;
  edge.tcp_streams = 64;
  EXPECT_TRUE(edge.validate().ok());
  edge.chunk_size = size_t{1} << 30;
  edge.tcp_streams = 1;
  edge.busy_poll = std::chrono::microseconds(0);
  EXPECT_TRUE(edge.validate().ok());
}

TEST(ConfigTest, DescribeListsEveryField) {
  Config c;
  c.backends = {"tcp"};
  auto lines = c.describe();
  std::map<std::string, std::string> m(lines.begin(), lines.end());
  for (const char* field : {"listen_address", "advertise_host", "backends", "allow_tcp_fallback",
                            "tcp_streams", "chunk_size", "busy_poll_us", "default_timeout_ms",
                            "io_stall_timeout_ms", "max_connections", "io_threads", "log_level"}) {
    EXPECT_TRUE(m.count(field)) << field;
  }
  EXPECT_EQ(m["backends"], "tcp");
  EXPECT_EQ(m["chunk_size"], "1 MiB");
  EXPECT_EQ(m["log_level"], "warn");
}

TEST(ParseSizeTest, AcceptsPlainAndSuffixed) {
  const std::pair<const char*, size_t> good[] = {
      {"0", 0},
      {"4096", 4096},
      {"64K", 64u << 10},
      {"64k", 64u << 10},
      {"4M", 4u << 20},
      {"4m", 4u << 20},
      {"1G", size_t{1} << 30},
      {"3g", size_t{3} << 30},
      {" 16K ", 16u << 10},
      {"9223372036854775807", size_t{9223372036854775807ull}},
      {"8589934591G", size_t{8589934591ull} << 30},  // 2^63 - 1 GiB
  };
  for (const auto& [text, value] : good) {
    auto r = parse_size(text);
    ASSERT_TRUE(r.ok()) << text << ": " << r.status().to_string();
    EXPECT_EQ(*r, value) << text;
  }
}

TEST(ParseSizeTest, RefusesGarbageAndOverflow) {
  for (const char* bad :
       {"", "   ", "K", "M", "abc", "1.5K", "-1", "-4K", "4KB", "4 K B", "1T", "0x10", "4K4",
        "17179869184G", "18446744073709551616", "99999999999999999999K",
        // 2^63 and above: found by fuzz_config, these parsed although their
        // decimal forms did not.
        "8589934592G", "16777777777g", "9007199254740992K"}) {
    auto r = parse_size(bad);
    EXPECT_FALSE(r.ok()) << "'" << bad << "' parsed as " << (r.ok() ? *r : 0);
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
}

}  // namespace
}  // namespace rdmabuf
