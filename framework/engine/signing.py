"""HMAC signatures for what a run keeps that could run code: the procedure's pickled state (resume never unpickles
blindly), and every row of the catalog's `meta` and `configs` (`sign_text`): replay imports the user functions `meta`
names only when they verify, so a run directory cannot name `os:system`.

The key lives outside the storage directory: `$MODELHOPPER_SECRET`, else `~/.config/modelhopper/secret.key`
(created with mode 0600 on first use). A pickle whose signature does not verify is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import secrets
from typing import Any


class SignatureError(RuntimeError):
    """A signed blob does not match its signature (tampered with, or signed with another key)."""


def _key() -> bytes:
    env = os.environ.get("MODELHOPPER_SECRET")
    if env:
        return env.encode()
    path = os.path.join(os.path.expanduser("~"), ".config", "modelhopper", "secret.key")
    if not os.path.exists(path):
        # written whole under a temporary name, then linked into place: a process starting at the same moment never
        # reads a half-written (or empty) key, and the first link wins
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process created it a moment ago: use theirs
        finally:
            os.remove(tmp)
    with open(path) as f:
        return f.read().strip().encode()


def sign_text(text: str) -> str:
    """This machine's signature of `text`."""
    return hmac.new(_key(), text.encode(), hashlib.sha256).hexdigest()


def verify_text(text: str, signature: str | None) -> bool:
    """Whether `signature` is this machine's signature of `text`."""
    return isinstance(signature, str) and hmac.compare_digest(sign_text(text), signature)


def dumps_signed(obj: Any) -> tuple[bytes, str]:
    blob = pickle.dumps(obj)
    return blob, hmac.new(_key(), blob, hashlib.sha256).hexdigest()


def loads_signed(blob: bytes, signature: str) -> Any:
    expected = hmac.new(_key(), blob, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        raise SignatureError("the stored procedure state does not match its signature; refusing to unpickle it")
    return pickle.loads(blob)  # noqa: S301 - verified above
