"""Run a command as a container's root would run under Docker's or containerd's defaults (issue
42: where the platform refuses a step, the launcher falls back and says so).

    python3 container_profile.py seccomp+caps|caps -- COMMAND...

- `caps`: the bounding set cut to the default capability set of both runtimes (moby
  daemon/pkg/oci/caps/defaults.go, containerd pkg/oci/spec.go: CHOWN, DAC_OVERRIDE, FSETID,
  FOWNER, MKNOD, NET_RAW, SETGID, SETUID, SETFCAP, SETPCAP, NET_BIND_SERVICE, SYS_CHROOT, KILL,
  AUDIT_WRITE), so root execs COMMAND without CAP_SYS_PTRACE or CAP_SYS_ADMIN (Kubernetes'
  default for a pod: its seccomp profile is Unconfined unless set).
- `seccomp+caps`: also the default seccomp profile's refusals on x86_64 for that capability
  set, installed (as runc does, without no_new_privs) before the capabilities go: the calls
  of this machine's syscall table that moby's profiles/seccomp/default.json (moby at commit
  b985e2313a86, vendored github.com/moby/profiles) and containerd's
  contrib/seccomp/seccomp_default.go do not allow without CAP_SYS_ADMIN, CAP_SYS_PTRACE and
  the rest, EPERM (the profile's defaultErrnoRet); clone3 ENOSYS; socket(AF_VSOCK) EPERM;
  clone with a namespace flag EPERM. Both allow ptrace and process_vm_readv from kernel 4.8
  (the kernel's own uid checks then apply) and gate pidfd_getfd, kcmp and process_madvise
  behind CAP_SYS_PTRACE. Calls newer than the table (above 450) are allowed here.

Standard library only: the launcher tests run it with the job Python.
"""

import ctypes
import os
import struct
import sys

DOCKER_CAPS = {0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31}  # the set above, by number
CAP_LAST = 40
PR_CAPBSET_DROP = 24
# name: x86_64 number, of every call the profile refuses a container with DOCKER_CAPS.
REFUSED = {
    "syslog": 103, "uselib": 134, "ustat": 136, "sysfs": 139, "vhangup": 153, "pivot_root": 155,
    "_sysctl": 156, "acct": 163, "settimeofday": 164, "mount": 165, "umount2": 166,
    "swapon": 167, "swapoff": 168, "reboot": 169, "sethostname": 170, "setdomainname": 171,
    "iopl": 172, "ioperm": 173, "create_module": 174, "init_module": 175, "delete_module": 176,
    "get_kernel_syms": 177, "query_module": 178, "quotactl": 179, "nfsservctl": 180,
    "getpmsg": 181, "putpmsg": 182, "afs_syscall": 183, "tuxcall": 184, "security": 185,
    "lookup_dcookie": 212, "clock_settime": 227, "vserver": 236, "mbind": 237,
    "set_mempolicy": 238, "get_mempolicy": 239, "kexec_load": 246, "add_key": 248,
    "request_key": 249, "keyctl": 250, "migrate_pages": 256, "unshare": 272, "move_pages": 279,
    "perf_event_open": 298, "fanotify_init": 300, "open_by_handle_at": 304, "setns": 308,
    "kcmp": 312, "finit_module": 313, "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "pidfd_getfd": 438, "process_madvise": 440, "mount_setattr": 442, "quotactl_fd": 443,
    "set_mempolicy_home_node": 450,
}  # fmt: skip
NR_SOCKET, NR_CLONE, NR_CLONE3, NR_SECCOMP = 41, 56, 435, 317
AF_VSOCK = 40
CLONE_NAMESPACE_FLAGS = 0x7E020000
AUDIT_ARCH_X86_64 = 0xC000003E
ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050001, 0x00050026


def _program() -> bytes:
    def insn(code: int, k: int = 0, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("=HBBI", code, jt, jf, k & 0xFFFFFFFF)

    ld_nr, ld_arch, ld_arg0 = insn(0x20, 0), insn(0x20, 4), insn(0x20, 16)
    prog = [ld_arch, insn(0x15, AUDIT_ARCH_X86_64, 1, 0), insn(0x06, ALLOW), ld_nr]
    for nr in sorted(REFUSED.values()):
        prog += [insn(0x15, nr, 0, 1), insn(0x06, EPERM)]
    prog += [insn(0x15, NR_CLONE3, 0, 1), insn(0x06, ENOSYS)]
    prog += [insn(0x15, NR_SOCKET, 0, 3), ld_arg0, insn(0x15, AF_VSOCK, 0, 1), insn(0x06, EPERM)]
    prog += [ld_nr, insn(0x15, NR_CLONE, 0, 3), ld_arg0]
    prog += [insn(0x45, CLONE_NAMESPACE_FLAGS, 0, 1), insn(0x06, EPERM), insn(0x06, ALLOW)]
    return b"".join(prog)


def main(argv: list[str]) -> None:
    mode, separator, command = argv[0], argv[1], argv[2:]
    if mode not in ("seccomp+caps", "caps") or separator != "--" or not command:
        raise SystemExit(__doc__)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if mode == "seccomp+caps":
        raw = _program()
        buf = ctypes.create_string_buffer(raw, len(raw))

        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        fprog = SockFprog(len(raw) // 8, ctypes.cast(buf, ctypes.c_void_p))
        if libc.syscall(ctypes.c_long(NR_SECCOMP), 1, 0, ctypes.byref(fprog)) != 0:
            raise OSError(ctypes.get_errno(), "installing the container profile")
    for cap in range(CAP_LAST + 1):
        if cap not in DOCKER_CAPS and libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            if ctypes.get_errno() != 22:  # EINVAL: a capability this kernel does not have
                raise OSError(ctypes.get_errno(), f"dropping capability {cap}")
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
