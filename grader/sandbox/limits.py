"""Limits the grading child puts on itself before any student cell runs: resources and files.

The command-line grader runs a student's code in a child process
(`grader.sandbox.grading_child`). Before the first student cell, the child

- lowers its resource limits (`Limits`): data memory, address space, CPU seconds, the size of a
  file it writes, the number of open files, the number of processes (RLIMIT_NPROC; the grader
  also puts it in a pids cgroup where it can, and watches what it writes: its folder, and the
  files its processes keep after deleting them);
- on Linux with Landlock (5.13 and later; `landlock_abi() > 0`), restricts itself for good
  (`restrict`): files can be written only inside its throwaway working directory, read only
  inside Python's installation, the refimpl and grader packages, the system folders and its own
  `/proc` entries (`file_rules`, made on resolved paths), so the solution notebooks, the other
  submissions, the grade file, the grader's environment and the reference's source (by any
  route: `hidden_routes`, which the child tries itself before any student cell,
  `readable_routes`) are out of reach; TCP is refused (Landlock ABI 4), and
  signals to processes outside the sandbox (the grader) are refused (ABI 6);
- on Linux (x86-64, arm64), allows itself Unix sockets only (`deny_sockets`, seccomp): no UDP,
  TCP, raw or packet socket, no io_uring.

Processes it starts inherit all of it.

This is what an unprivileged process can do to itself; it is not a container. A hostile
submission should still be graded in a throwaway container or virtual machine (see the
instructor guide, `notebooks/exercises/README.md`).
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import site
import sys
from dataclasses import dataclass
from pathlib import Path

import grader
import refimpl


@dataclass(frozen=True)
class Limits:
    """Resource limits of the grading child (soft and hard).

    The data limit is the memory limit proper: it counts the heap and anonymous mappings but
    not mapped libraries, so importing a large library such as torch (about 0.6 GB of address
    space and 0.2 GB of data for the CPU build) still works. The address-space limit is a
    looser backstop. Measured: the child with refimpl imported uses about 0.11 GB of address
    space and 0.06 GB of data.
    """

    data_bytes: int = 4 * 2**30
    address_space_bytes: int = 16 * 2**30
    cpu_seconds: int = 300  # the grader sets it to the notebook's time-out plus 10 s
    file_bytes: int = 64 * 2**20
    open_files: int = 256
    # processes (and threads) the child and everything it starts may have at once
    processes: int = 64
    # what it may write, all files together: its folder, and the files its processes keep open
    # or mapped after deleting them (the grader watches both); files in its folder
    write_bytes: int = 256 * 2**20
    write_files: int = 10_000

    def apply(self, processes_before: int = 0) -> None:
        """Lower this process's limits (a limit that is already lower stays as it is; one the
        system does not offer, such as the address space on macOS, is skipped).

        RLIMIT_NPROC counts every process of the user, so it is set to `processes_before` (how
        many the user had when the child started) plus `processes`; the kernel ignores it
        for root, where only a pids cgroup (`grader.sandbox.processes.PidsCgroup`) caps them.
        """
        import resource

        for which, value in (
            (resource.RLIMIT_DATA, self.data_bytes),
            (resource.RLIMIT_AS, self.address_space_bytes),
            (resource.RLIMIT_CPU, self.cpu_seconds),
            (resource.RLIMIT_FSIZE, self.file_bytes),
            (resource.RLIMIT_NOFILE, self.open_files),
            (getattr(resource, "RLIMIT_NPROC", None), processes_before + self.processes),
        ):
            if which is None:
                continue
            try:
                _, hard = resource.getrlimit(which)
                new = value if hard == resource.RLIM_INFINITY else min(value, hard)
                resource.setrlimit(which, (new, new))
            except (ValueError, OSError):
                continue


# --- Landlock (Linux): see the kernel's Documentation/userspace-api/landlock.rst
# the same on every architecture
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
# rights that apply to a file itself
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers (0: none, or not Linux)."""
    libc = _libc()
    if libc is None:
        return 0
    version = libc.syscall(
        _SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION)
    )
    return max(int(version), 0)


def _fs_rights(abi: int) -> int:
    rights = (1 << 13) - 1  # EXECUTE .. MAKE_SYM (ABI 1)
    if abi >= 2:
        rights |= _REFER
    if abi >= 3:
        rights |= _TRUNCATE
    if abi >= 5:
        rights |= _IOCTL_DEV
    return rights


@dataclass(frozen=True)
class FileRules:
    """Where the child may read (None: reads are not restricted), list folders, and write."""

    read: tuple[str, ...] | None  # files, and folders with everything beneath them
    write: tuple[str, ...]
    # folders whose entries may be listed, not read (they hold hidden files)
    list_only: tuple[str, ...] = ()
    note: str = ""  # why reads are not restricted, when they are not
    # every path under which a hidden file could be reached (`hidden_routes`): the child tries
    # them all once the rules hold, and refuses to grade if it can read one
    hidden: tuple[str, ...] = ()


_SYSTEM_READ = (
    "/usr",
    "/lib",
    "/lib32",
    "/lib64",
    "/bin",
    "/sbin",
    "/etc",
    "/dev",
    "/sys",
    # /proc: the system-wide files libraries read, and the child's own folder (`/proc/self`,
    # resolved in the child), never another process's (the grader's environment and command
    # line)
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/proc/stat",
    "/proc/loadavg",
    "/proc/uptime",
    "/proc/version",
    "/proc/filesystems",
    "/proc/sys",
    "/proc/self",
    "/proc/thread-self",
)


def python_roots() -> list[str]:
    """The folders Python needs to run refimpl, as they are named: its installation, its
    site-packages folders (those a `.pth` file or PYTHONPATH adds too), the refimpl and grader
    packages, the system folders."""
    packages = [str(Path(p.__file__).resolve().parent) for p in (refimpl, grader)]
    roots = {
        sys.prefix,
        sys.exec_prefix,
        sys.base_prefix,
        sys.base_exec_prefix,
        *packages,
        *_SYSTEM_READ,
    }
    roots.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    user_site = site.getusersitepackages() if hasattr(site, "getusersitepackages") else None
    if user_site and user_site in sys.path:
        roots.add(user_site)
    # an installed package's folder on sys.path, wherever it was added from (never a checkout:
    # its notebooks hold the solutions, and only its two packages are needed)
    roots.update(p for p in sys.path if Path(p).name in ("site-packages", "dist-packages"))
    return sorted(r for r in roots if r and Path(r).exists())


def file_rules(workdir: str, protected: list[str], hidden: list[str] = ()) -> FileRules:
    """The child's file rules: write in `workdir`; read Python, refimpl, the system and
    `workdir`.

    `protected` are folders the child must not read (the solutions, the submissions, the grade
    file's folder). If one of them lies inside a folder Python needs, reads cannot be
    restricted without breaking Python; then only writes are, and `note` says why. `hidden` are
    files inside the readable folders that stay unreadable (the source of the reference code an
    exercise asks for: the child's refimpl lacks it, and must not load it from its file).

    Every rule is made on resolved paths, since a rule holds for what its path resolves to: a
    link (a venv's `lib64 -> lib`) or a bind mount that leads to a hidden file is never granted
    whole. Deny by default: a folder is readable whole only if no hidden file, under any of its
    names (`hidden_routes`), lies beneath it.
    """
    roots = python_roots()
    # /proc/self stays a link here: the child resolves it to its own folder
    resolved = sorted({r if r.startswith("/proc/") else os.path.realpath(r) for r in roots})
    workdir = os.path.realpath(workdir)
    for folder in protected:
        inside = [r for r in resolved if Path(folder).resolve().is_relative_to(r)]
        if inside:
            note = (
                f"graded code can read {folder} "
                f"(it lies inside {inside[0]}, which Python needs)"
            )
            return FileRules(None, (workdir,), note=note)
    read, list_only, routes = _read_rules(tuple(roots), tuple(sorted(hidden)))
    return FileRules(read + (workdir,), (workdir,), list_only, hidden=routes)


@functools.cache  # the same for every child of a run
def _read_rules(
    roots: tuple[str, ...], hidden: tuple[str, ...]
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(folders and files to read, folders to list, every route to a hidden file)."""
    routes = hidden_routes(list(hidden), list(roots))
    # what a rule can name: real paths, and the same files seen through other mounts
    real = {r for r in routes if r == os.path.realpath(r) or not os.path.exists(r)}
    resolved = sorted({r if r.startswith("/proc/") else os.path.realpath(r) for r in roots})
    read: list[str] = []
    list_only: list[str] = []
    seen: set[str] = set()
    for root in resolved:
        _allow_around(root, real, read, list_only, seen)
    return tuple(read), tuple(list_only), tuple(sorted(routes))


def _allow_around(
    path: str, hidden: set[str], read: list[str], list_only: list[str], seen: set[str]
) -> None:
    """Allow reading `path` whole, or, if hidden files lie beneath it, everything beside
    them. A link is followed (a rule holds for its target): its target is judged instead."""
    if not path.startswith("/proc/"):
        path = os.path.realpath(path)
    if path in seen or path in hidden:
        return
    seen.add(path)
    if not any(h.startswith(path.rstrip("/") + "/") for h in hidden):
        read.append(path)
        return
    list_only.append(path)
    try:
        entries = sorted(os.listdir(path))
    except OSError:
        return
    for entry in entries:
        _allow_around(os.path.join(path, entry), hidden, read, list_only, seen)


def hidden_routes(hidden: list[str], roots: list[str] = ()) -> set[str]:
    """Every path under which a hidden file (or folder, with the files beneath it) could be
    opened:

    - the path given and its resolved path;
    - another copy of the same package file on sys.path, in a site-packages folder or in one
      of `roots` (a site-packages copy of refimpl beside a checkout);
    - its compiled caches in `__pycache__`, those that exist and those Python would write;
    - the same file through a link (a venv's `lib64 -> lib`, a link on sys.path) or through
      another mount of its folder (a bind mount), found in /proc/self/mountinfo.
    """
    files: set[str] = set()
    for path in hidden:
        files.add(path)
        real = os.path.realpath(path)
        files.add(real)
        if os.path.isdir(real):
            files.update(str(p) for p in Path(real).rglob("*") if p.is_file())
    files.update(_copies(files, roots))
    files.update(_compiled(files))
    mounts = _mounts()
    real_files = {os.path.realpath(f) for f in files}
    for f in list(real_files):
        files.update(_mount_aliases(f, mounts))
    files.update(_link_aliases(files, roots))
    return files


def _package_parents() -> list[str]:
    return [str(Path(p.__file__).resolve().parent.parent) for p in (refimpl, grader)]


def _copies(files: set[str], roots: list[str]) -> set[str]:
    """The same package files (refimpl/..., grader/...) in every other folder packages are
    imported from."""
    relative = set()
    for parent in _package_parents():
        for f in files:
            real = Path(os.path.realpath(f))
            if real.is_relative_to(parent):
                relative.add(real.relative_to(parent))
    folders = {*sys.path, *roots}
    folders.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    copies = set()
    for folder in folders:
        if not folder or not os.path.isdir(folder):
            continue
        for rel in relative:
            candidate = Path(folder) / rel
            if candidate.exists():
                copies.add(str(candidate))
                copies.add(os.path.realpath(candidate))
    return copies


def _compiled(files: set[str]) -> set[str]:
    """The `__pycache__` files of every source in `files`: those there now, and those Python
    would write (a rule made now must cover a cache written later)."""
    tag = sys.implementation.cache_tag
    caches = set()
    for f in files:
        path = Path(f)
        if path.suffix != ".py":
            continue
        cache = path.parent / "__pycache__"
        caches.update(
            str(cache / f"{path.stem}.{tag}{opt}.pyc") for opt in ("", ".opt-1", ".opt-2")
        )
        if cache.is_dir():
            caches.update(str(p) for p in cache.glob(f"{path.stem}.*.pyc"))
    return caches


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in octal
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts() -> list[tuple[str, str, str]]:
    """(device, folder of that file system it shows, mount point) of every mount this
    process sees, in mount order (empty where there is no /proc/self/mountinfo)."""
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 5:
            rows.append((fields[2], _unescape(fields[3]), _unescape(fields[4])))
    return rows


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _mount_aliases(path: str, mounts: list[tuple[str, str, str]]) -> set[str]:
    """The other paths of `path` (a resolved path) through other mounts of its file system
    that show it (bind mounts)."""
    holding = [(len(m[2]), i) for i, m in enumerate(mounts) if _under(path, m[2])]
    if not holding:
        return set()
    device, root, point = mounts[max(holding)[1]]
    inside = root.rstrip("/") + "/" + path[len(point) :].lstrip("/")
    aliases = set()
    for other_device, other_root, other_point in mounts:
        if other_device == device and _under(inside, other_root):
            rest = inside[len(other_root.rstrip("/")) :].lstrip("/")
            aliases.add(other_point.rstrip("/") + "/" + rest if rest else other_point)
    aliases.discard(path)
    return aliases


def _link_aliases(files: set[str], roots: list[str]) -> set[str]:
    """The same files through a link that leads into one of their folders: an entry of the
    folders Python is installed in (a venv's `lib64 -> lib`), a link on sys.path or among
    `roots`."""
    places = {
        sys.prefix,
        sys.exec_prefix,
        sys.base_prefix,
        sys.base_exec_prefix,
        *sys.path,
        *roots,
    }
    places.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    links: set[str] = set()
    for place in places:
        if not place or place.startswith("/proc/"):
            continue
        path = Path(place)
        candidates = [path, *path.parents]
        for folder in [path, path.parent]:
            try:
                candidates += [e for e in folder.iterdir() if e.is_symlink()]
            except OSError:
                pass
        # a link, or a path with a link above it (macOS's /tmp)
        links.update(str(c) for c in candidates if str(c) != os.path.realpath(c))
    aliases = set()
    real_files = {os.path.realpath(f) for f in files}
    for link in links:
        target = os.path.realpath(link)
        for f in real_files:
            if _under(f, target) and f != target:
                aliases.add(link.rstrip("/") + f[len(target) :])
    return aliases


def readable_routes(routes: list[str]) -> list[str]:
    """The routes to files this process can read a byte through (a hidden folder's names may
    be listed: a rule to list a folder holds beneath it; its files are routes of their own)."""
    readable = []
    for route in routes:
        try:
            if os.path.isdir(route):
                continue
            with open(route, "rb") as handle:
                handle.read(1)
        except OSError:
            continue
        readable.append(route)
    return readable


def restrict(rules: FileRules) -> int:
    """Apply `rules` with Landlock to this process for good; returns the ABI used (0: not
    available)."""
    abi = landlock_abi()
    libc = _libc()
    if abi == 0 or libc is None:
        return 0
    write_rights = _fs_rights(abi)
    read_rights = _EXECUTE | _READ_FILE | _READ_DIR | (_IOCTL_DEV if abi >= 5 else 0)
    handled = (
        write_rights
        if rules.read is not None
        else write_rights & ~(_EXECUTE | _READ_FILE | _READ_DIR | _IOCTL_DEV)
    )
    attr = _RulesetAttr(
        handled,
        _NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0,
        _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0,
    )
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = libc.syscall(
        _SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)
    )
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        allowed = [(path, write_rights) for path in rules.write] + [
            ("/dev/null", _READ_FILE | _WRITE_FILE | _TRUNCATE)
        ]
        allowed += [(path, read_rights) for path in rules.read or ()]
        allowed += (
            [(path, _READ_DIR) for path in rules.list_only] if rules.read is not None else []
        )
        for path, rights in allowed:
            _add_rule(libc, ruleset, path, rights & handled)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return abi


def _add_rule(libc: ctypes.CDLL, ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a folder this system does not have
    try:
        if not os.path.isdir(path):
            rights &= _FILE_RIGHTS
        if rights == 0:
            return
        attr = _PathBeneathAttr(rights, fd)
        if (
            libc.syscall(
                _SYS_ADD_RULE,
                ctypes.c_int(ruleset),
                ctypes.c_int(_RULE_PATH_BENEATH),
                ctypes.byref(attr),
                ctypes.c_uint32(0),
            )
            != 0
        ):
            raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
    finally:
        os.close(fd)


# --- seccomp (Linux): no sockets but Unix ones
# struct seccomp_data: nr at 0, arch at 4, args[0] at 16 (its low 32 bits, little-endian)
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# socket, socketpair, io_uring_setup (io_uring can open sockets without the socket call)
_SOCKET_CALLS = {"x86_64": (41, 53, 425), "aarch64": (198, 199, 425)}
_X32_SYSCALL_BIT = 0x40000000
_AF_UNIX = 1
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_RET_ALLOW, _RET_ERRNO_EACCES = 0x7FFF0000, 0x00050000 | 13
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _machine() -> str:
    return os.uname().machine if hasattr(os, "uname") else ""


def seccomp_available() -> bool:
    """Whether `deny_sockets` can filter system calls here (Linux on x86-64 or arm64)."""
    return _libc() is not None and _machine() in _AUDIT_ARCH


def socket_filter() -> list[tuple[int, int, int, int]]:
    """The seccomp program (code, jt, jf, k): `socket` and `socketpair` only for AF_UNIX, no
    `io_uring_setup`, no system call of another ABI (x32, 32-bit); everything else allowed.

    A jump's jt and jf count the instructions to skip, as classic BPF does.
    """
    machine = _machine()
    socket_nr, socketpair_nr, io_uring_nr = _SOCKET_CALLS[machine]
    return [
        (_LD_W_ABS, 0, 0, 4),  # 0: the ABI
        (_JEQ_K, 0, 9, _AUDIT_ARCH[machine]),  # 1: another ABI -> 11 (deny)
        (_LD_W_ABS, 0, 0, 0),  # 2: the system call
        (_JGE_K, 7, 0, _X32_SYSCALL_BIT),  # 3: x32 -> 11 (deny)
        (_JEQ_K, 3, 0, socket_nr),  # 4: -> 8
        (_JEQ_K, 2, 0, socketpair_nr),  # 5: -> 8
        (_JEQ_K, 4, 0, io_uring_nr),  # 6: -> 11 (deny)
        (_RET_K, 0, 0, _RET_ALLOW),  # 7: anything else
        (_LD_W_ABS, 0, 0, 16),  # 8: the address family
        (_JEQ_K, 0, 1, _AF_UNIX),  # 9: Unix -> 10, else 11
        (_RET_K, 0, 0, _RET_ALLOW),  # 10
        (_RET_K, 0, 0, _RET_ERRNO_EACCES),  # 11: deny
    ]


def deny_sockets() -> bool:
    """Refuse this process (and what it starts) every socket but Unix ones: no UDP, TCP, raw
    or packet socket, whatever Landlock covers. False where seccomp is not available."""
    if not seccomp_available():
        return False
    libc = _libc()
    program = socket_filter()
    filters = (_SockFilter * len(program))(*[_SockFilter(*row) for row in program])
    fprog = _SockFprog(len(program), filters)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
    return True
