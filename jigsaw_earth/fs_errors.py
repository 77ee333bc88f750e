"""One-line explanations of filesystem errors: the path, the OS reason and the fix.

``explain(err)`` turns any ``OSError`` (a blocked or read-only directory, a full disk, a missing
parent, a file where a folder should be) into a sentence for the command line, so no filesystem
fault ends in a traceback. ``cli.main`` applies it to every ``OSError`` a command lets through.
"""

from __future__ import annotations

import errno
import os

__all__ = ["explain", "os_error_in"]

_FIXES = {
    errno.ENOSPC: "free disk space there, lower checkpoint.keep, or point run.dir at a larger filesystem",
    errno.EDQUOT: "free space in your quota, lower checkpoint.keep, or point run.dir elsewhere",
    errno.EACCES: "make it writable for this user (chmod/chown) or choose another directory",
    errno.EPERM: "make it writable for this user (chmod/chown) or choose another directory",
    errno.EROFS: "the filesystem is read-only; choose a directory on a writable filesystem",
    errno.ENOENT: "create the missing directory or correct the path",
    errno.ENOTDIR: "a file stands where a directory is expected; move that file or choose another path",
    errno.EEXIST: "something already exists there; move it aside or choose another path",
    errno.EISDIR: "a directory stands where a file is expected; choose another path",
    errno.ENAMETOOLONG: "use a shorter path",
    errno.EMFILE: "raise the open-file limit (ulimit -n)",
}


def explain(err: OSError, action: str = "cannot access") -> str:
    """``"<action> PATH: <OS reason> [ERRNO]; <fix>"`` for ``err``."""
    path = err.filename if err.filename is not None else "(unknown path)"
    if err.filename2 is not None:
        path = f"{err.filename} -> {err.filename2}"
    reason = err.strerror or str(err)
    code = errno.errorcode.get(err.errno or 0, "")
    fix = _FIXES.get(err.errno or 0, "check the path and its filesystem")
    return f"{action} {os.fspath(path)}: {reason}{f' [{code}]' if code else ''}; {fix}"


def os_error_in(exc: BaseException) -> OSError | None:
    """The first ``OSError`` in ``exc``'s chain (causes, contexts and DCP's per-rank failures)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno is not None:
            return e
        failures = getattr(e, "failures", None)  # torch.distributed.checkpoint CheckpointException
        if isinstance(failures, dict):
            todo.extend(f[0] for f in failures.values() if isinstance(f, tuple) and f)
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
    return None
