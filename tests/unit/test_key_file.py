"""The key file beside a SQLite database: made once, read by everyone, never replaced."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import threading
import time
from pathlib import Path

import pytest

from relaybox.outbound.vault import KeyFile, KeyFileError, Vault, new_key


def test_a_reader_waits_for_a_file_another_creator_is_still_writing(tmp_path: Path) -> None:
    """Without hard links, a creator makes the name empty (``O_EXCL``) and writes its key
    a moment later; a reader arriving in between gets that key, not an error."""
    path = tmp_path / "relaybox.db.key"
    key = new_key()
    path.touch(mode=0o600)

    def finish() -> None:
        time.sleep(0.3)
        path.write_text(key + "\n")

    writer = threading.Thread(target=finish)
    writer.start()
    try:
        assert KeyFile(path).read_or_create() == key
    finally:
        writer.join()


@pytest.mark.parametrize("content", ["", "not a key\n", "x" * 20])
def test_an_old_file_without_a_key_is_an_error_at_once(tmp_path: Path, content: str) -> None:
    path = tmp_path / "relaybox.db.key"
    path.write_text(content)
    os.utime(path, (time.time() - 60, time.time() - 60))
    started = time.monotonic()
    with pytest.raises(KeyFileError, match="no valid key"):
        KeyFile(path).read_or_create()
    assert time.monotonic() - started < 1
    assert path.read_text() == content  # never replaced


def test_a_whole_file_written_just_now_without_a_key_is_an_error_at_once(tmp_path: Path) -> None:
    path = tmp_path / "relaybox.db.key"
    path.write_text("x" * 60 + "\n")
    started = time.monotonic()
    with pytest.raises(KeyFileError, match="no valid key"):
        KeyFile(path).read_or_create()
    assert time.monotonic() - started < 1


def test_a_derived_key_is_the_hmac_of_the_first_keys_bytes(tmp_path: Path) -> None:
    """``Vault.derive`` (the portal's link key without a key of its own) is an HMAC
    keyed by the first sealing key's 32 bytes, whatever cryptography's Fernet keeps
    (since cryptography 51 it keeps nothing readable): links signed before stay valid.
    The same from a key file."""
    first, second = new_key(), new_key()
    expected = hmac.new(
        base64.urlsafe_b64decode(first), b"relaybox-derive\0portal", hashlib.sha256
    ).digest()
    assert Vault(f" {first} , {second}").derive("portal") == expected
    assert Vault(f"{first},{second}").derive("other") != expected
    path = tmp_path / "key"
    path.write_text(first + "\n")
    assert Vault(None, key_file=KeyFile(path)).derive("portal") == expected
