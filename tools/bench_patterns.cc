// `rdmabuf bench --pattern`: collective patterns (p2p, fan-in, fan-out,
// all-to-all, ring) across ranks and hosts, beside torch.distributed's
// send/recv over gloo in the same processes. Its ranks run gloo, so they
// are Python processes: this command becomes the Python module
// rdmabuf.bench_patterns with the same arguments, which starts the ranks
// (on hosts of this machine, or this host) or, under torchrun, srun or
// mpirun, is one of them.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/socket.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "tools/subprocess.h"

namespace rdmabuf::tool {

int cmd_bench_patterns(int argc, char** argv) {
  std::string python = bench_python();
#ifdef RDMABUF_BUILD_PYTHON_DIR
  // Run from a build tree: its package first (installed, it is on the
  // interpreter's own path).
  if (::access(RDMABUF_BUILD_PYTHON_DIR "/rdmabuf/bench_patterns.py", R_OK) == 0) {
    const char* old = std::getenv("PYTHONPATH");
    std::string path = RDMABUF_BUILD_PYTHON_DIR;
    if (old && *old) path += std::string(":") + old;
    ::setenv("PYTHONPATH", path.c_str(), 1);
  }
#endif
  std::vector<std::string> words = {python, "-m", "rdmabuf.bench_patterns"};
  for (int i = 2; i < argc; ++i)
    words.emplace_back(argv[i]);
  std::vector<char*> exec_argv;
  for (std::string& w : words)
    exec_argv.push_back(w.data());
  exec_argv.push_back(nullptr);
  ::execvp(exec_argv[0], exec_argv.data());
  return fail(FailedPrecondition("bench --pattern runs " + python +
                                 " -m rdmabuf.bench_patterns (Python with torch and the rdmabuf "
                                 "package; RDMABUF_BENCH_PYTHON names another): " +
                                 errno_text(errno)));
}

}  // namespace rdmabuf::tool
