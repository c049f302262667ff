"""HMAC keys and signatures: what lets a run tell the data it wrote from data someone else edited.

Two things are signed with this machine's key: the procedure's pickled state (`dumps_signed`; resume never unpickles
a blob that does not verify), and every row of a run's catalog (`framework.store.catalog`: one MAC per row, and a
signed digest per table).

The key lives outside the storage directory: `$MODELHOPPER_SECRET` (at least 32 characters), else
`~/.config/modelhopper/secret.key`, created with owner-only permissions (0600, in a 0700 folder) when a new run first
needs it. Only a writer of a new run creates it: a reader or a resume that finds no key raises `SigningKeyError`,
naming the file and the way out, rather than make a new key under which nothing the run wrote verifies.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import secrets
from typing import Any

#: the fewest bytes a key may have: an empty or short key is a typo, not a secret
MIN_KEY_BYTES = 32
KEY_ENV = "MODELHOPPER_SECRET"


class SignatureError(RuntimeError):
    """A signed blob does not match its signature (tampered with, or signed with another key)."""


class SigningKeyError(SignatureError):
    """This machine's signing key is missing, empty or too short."""


def key_path() -> str:
    """Where this machine's key file lives (used when `$MODELHOPPER_SECRET` is not set)."""
    return os.path.join(os.path.expanduser("~"), ".config", "modelhopper", "secret.key")


def load_key(create: bool = False) -> bytes:
    """This machine's key. `create=True` (a writer starting a new run) makes the key file when there is none;
    otherwise a missing key raises `SigningKeyError`. An empty or short key is always refused."""
    env = os.environ.get(KEY_ENV)
    if env is not None:
        if len(env.encode()) < MIN_KEY_BYTES:
            raise SigningKeyError(f"`${KEY_ENV}` is {len(env.encode())} bytes long, but a signing key must have at "
                                  f"least {MIN_KEY_BYTES}; unset it to use {key_path()}")
        return env.encode()
    path = key_path()
    if not os.path.exists(path):
        if not create:
            raise SigningKeyError(
                f"the signing key {path} is missing, so nothing a run on this machine wrote can be verified. Restore "
                f"the file (or set ${KEY_ENV} to the key the runs were made with); to use a run anyway, pass "
                "trust_unverified=True (CLI: --trust-unverified) and the functions and procedure it needs")
        _create_key(path)
    with open(path) as f:
        key = f.read().strip().encode()
    if len(key) < MIN_KEY_BYTES:
        raise SigningKeyError(f"the signing key {path} holds {len(key)} bytes, but a key must have at least "
                              f"{MIN_KEY_BYTES}; restore it, or delete it to have a new one made (runs signed with "
                              "the old key then no longer verify)")
    return key


def _create_key(path: str) -> None:
    # written whole under a temporary name, then linked into place: a process starting at the same moment never reads
    # a half-written (or empty) key, and the first link wins
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
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


def mac(key: bytes, data: bytes) -> str:
    """The HMAC-SHA256 of `data` under `key`, as hex."""
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def dumps_signed(obj: Any) -> tuple[bytes, str]:
    """Pickle `obj` and sign the bytes (a writer: the key is created if this machine has none)."""
    blob = pickle.dumps(obj)
    return blob, mac(load_key(create=True), blob)


def loads_signed(blob: bytes, signature: str | None) -> Any:
    """Unpickle `blob` only when `signature` is this machine's signature of it."""
    if not isinstance(signature, str) or not hmac.compare_digest(mac(load_key(), blob), signature):
        raise SignatureError("the stored procedure state does not match its signature (signed with another key, or "
                             "edited); refusing to unpickle it: pass `procedure=` to resume with a fresh one")
    return pickle.loads(blob)  # noqa: S301 - verified above
