// pthread_attr_setstacksize for every Loom service process: a thread that a
// library starts with a stack size of its own gets that much stack on top of
// the process's static thread-local storage (TLS).
//
// Why: glibc places each new thread's static TLS (that of every library
// loaded at start) inside the stack size the thread was asked with. civetweb,
// the /metrics server of every service (through prometheus-cpp), asks for
// 100 KB, fixed when Debian compiled it. OpenBLAS alone holds 60 KB of TLS,
// and a CUDA build adds cudart's and NCCL's 16 KB: a worker's civetweb
// threads were left 14 KB of stack. Serving /metrics then ran past the end,
// over the 4 KB guard page and into the descriptor of the thread whose stack
// lies below, which crashed when it woke up at shutdown: every CUDA-built
// worker died of SIGSEGV after its job (and hung on the first GPU run, in
// UCX's crash handler). AddressSanitizer's larger frames did it to CPU
// builds too (docs/status.md).
//
// The definition here takes precedence over libc's for every caller in the
// process (the executable and its libraries are searched before libc), and
// forwards to libc's with the TLS added.
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>

#include <cstddef>

namespace {

// The TLS segments of every object loaded so far, each with its alignment.
size_t LoadedTlsBytes() {
  size_t total = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type == PT_TLS) *static_cast<size_t*>(data) += ph.p_memsz + ph.p_align;
        }
        return 0;
      },
      &total);
  return total;
}

}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using Fn = int (*)(pthread_attr_t*, size_t);
  static const Fn libc = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  static const size_t tls = LoadedTlsBytes();
  return libc(attr, size + tls);
}
