#pragma once

namespace rdmabuf {

// "MAJOR.MINOR.PATCH" of this library.
const char* version();

}  // namespace rdmabuf
