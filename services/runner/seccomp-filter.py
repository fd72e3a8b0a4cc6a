# Writes the seccomp filter of every sandbox stage to stdout, as a BPF program
# that bwrap loads (--seccomp) before it runs anything of the sandbox's.
#
# In the spirit of the common container default: everything is allowed except
# what reaches the kernel's shared state or other processes, which fails with
# EPERM: mounting, new namespaces (unshare, setns, clone with a namespace
# flag; clone3 answers ENOSYS so that the C library falls back to clone),
# tracing and reading other processes' memory, keyrings, BPF, userfaultfd,
# io_uring, kernel modules, kexec, reboot, swap, the clock, accounting,
# quotas, file handles, perf events, the LDT, personality flags that turn off
# protections (executable data, address randomisation).
#
# Uses libseccomp (Debian: python3-seccomp), which knows each architecture's
# syscall numbers. The filter is for the native architecture only: a call
# through another ABI (32-bit x86 or x32 on x86_64) ends the process.
import errno
import sys

import seccomp

DENIED = [
    # mounts and the file system tree
    "mount", "umount", "umount2", "pivot_root", "chroot", "mount_setattr", "move_mount",
    "open_tree", "fsopen", "fsconfig", "fsmount", "fspick",
    # namespaces
    "unshare", "setns",
    # other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise",
    # kernel state
    "keyctl", "add_key", "request_key", "bpf", "userfaultfd", "perf_event_open",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "init_module", "finit_module", "delete_module", "create_module", "query_module", "get_kernel_syms",
    "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "stime",
    "open_by_handle_at", "name_to_handle_at", "lookup_dcookie", "syslog", "vhangup",
    "iopl", "ioperm", "uselib", "ustat", "sysfs", "_sysctl", "nfsservctl",
    "fanotify_init", "vm86", "vm86old", "modify_ldt",
]

# personality() stays for what runtimes ask of it (reading it, PER_LINUX), but not these flags.
PERSONALITY_FLAGS = [
    0x0400000,  # READ_IMPLIES_EXEC: every readable page executable
    0x0040000,  # ADDR_NO_RANDOMIZE: no address space layout randomisation
]

NAMESPACE_FLAGS = [
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
    0x00000080,  # CLONE_NEWTIME
]


def build():
    f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    for name in DENIED:
        try:
            f.add_rule(seccomp.ERRNO(errno.EPERM), name)
        except (RuntimeError, ValueError):
            pass  # not a syscall of this architecture
    for flag in NAMESPACE_FLAGS:
        f.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    f.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    for flag in PERSONALITY_FLAGS:
        # With bit 31 clear: 0xffffffff, which only reads the personality, has every bit set.
        f.add_rule(seccomp.ERRNO(errno.EPERM), "personality", seccomp.Arg(0, seccomp.MASKED_EQ, flag | 0x80000000, flag))
    return f


if __name__ == "__main__":
    build().export_bpf(sys.stdout.buffer)
