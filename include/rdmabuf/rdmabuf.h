// rdmabuf: one-sided remote memory access between processes.
// The umbrella header; see README.md for a tour.
#pragma once

#include "rdmabuf/backend.h"
#include "rdmabuf/buffer.h"
#include "rdmabuf/config.h"
#include "rdmabuf/endpoint.h"
#include "rdmabuf/gpu.h"
#include "rdmabuf/manager.h"
#include "rdmabuf/memory.h"
#include "rdmabuf/op.h"
#include "rdmabuf/status.h"
#include "rdmabuf/transfer.h"
#include "rdmabuf/version.h"
