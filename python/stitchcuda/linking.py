"""How every program is linked: ``-z defs`` and a trace of each name a program may not call.

Building and verifying link a program the same way, so they share one build cache entry; the
Verifier's sandbox (:mod:`stitchcuda.verifier.static.sandbox`) reads the linker's trace of these
names to refuse a program whose own object calls one.
"""

from __future__ import annotations

# family -> (rule id, exact names traced at link time)
DENY: dict[str, tuple[str, tuple[str, ...]]] = {
    "dynamic loading": ("sandbox-dynamic-loading", (
        "dlopen", "dlmopen", "dlsym", "dlvsym", "dladdr", "dladdr1", "dlinfo",
        "cuModuleLoad", "cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary", "cuLibraryLoadData",
        "cuLibraryLoadFromFile", "cudaLibraryLoadData", "cudaLibraryLoadFromFile", "nvrtcCreateProgram",
        "nvrtcCompileProgram", "nvJitLinkCreate")),
    "dynamic linker": ("sandbox-link-map", (
        "_r_debug", "r_debug", "_dl_debug_state", "dl_iterate_phdr", "_dl_find_object", "_DYNAMIC",
        "__ehdr_start", "__executable_start", "getauxval", "__getauxval", "__libc_stack_end",
        "_dl_argv", "program_invocation_name", "program_invocation_short_name")),
    "driver entry point": ("sandbox-driver-entry-point", (
        "cuGetProcAddress", "cuGetProcAddress_v2", "cudaGetDriverEntryPoint", "cudaGetDriverEntryPointByVersion",
        "cuGetExportTable", "cudaGetExportTable")),
    "file access": ("sandbox-file-access", (
        "open", "open64", "openat", "openat64", "__open_2", "__open64_2", "__openat_2", "__openat64_2", "creat",
        "creat64", "fopen", "fopen64", "freopen", "freopen64", "fdopen", "opendir", "fdopendir", "readdir",
        "readdir64", "stat", "stat64", "lstat", "lstat64", "fstatat", "fstatat64", "statx", "__xstat", "__xstat64",
        "__lxstat", "__lxstat64", "__fxstatat", "__fxstatat64", "access", "faccessat", "readlink", "readlinkat",
        "realpath", "read", "pread", "pread64", "readv", "write", "pwrite", "pwrite64", "writev", "sendfile",
        "splice", "mmap", "mmap64", "unlink", "remove", "rename", "mkdir", "chdir", "getcwd", "nftw", "mkfifo")),
    "environment": ("sandbox-environment", (
        "getenv", "secure_getenv", "__libc_secure_getenv", "setenv", "putenv", "unsetenv", "clearenv", "environ",
        "__environ", "_environ")),
    "threads": ("sandbox-thread", (
        "pthread_create", "thrd_create", "clone", "clone3", "fork", "vfork", "_Fork", "execve", "execv", "execvp",
        "execvpe", "execl", "execlp", "execle", "fexecve", "system", "popen", "posix_spawn", "posix_spawnp",
        "cudaLaunchHostFunc", "cudaStreamAddCallback", "cuLaunchHostFunc", "cuStreamAddCallback")),
    "system": ("sandbox-system", (
        "syscall", "ptrace", "prctl", "process_vm_readv", "process_vm_writev", "kill", "tgkill", "socket",
        "socketpair", "connect", "bind", "listen", "accept", "accept4", "sendmsg", "recvmsg", "shm_open", "shmget",
        "shmat", "cudaIpcGetMemHandle", "cudaIpcOpenMemHandle", "cudaIpcGetEventHandle", "cudaIpcOpenEventHandle")),
}

BY_NAME = {name: (family, rule) for family, (rule, names) in DENY.items() for name in names}

#: Link flags of every program built: ``-z defs`` and the traced names.
LINK_FLAGS: tuple[str, ...] = ("-Xlinker=-z,defs",) + tuple(
    f"-Xlinker=--trace-symbol={name}" for name in sorted(BY_NAME))
