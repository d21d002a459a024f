"""elastic.ids gives what uuid.uuid4() gives without importing uuid; fqdn() is getfqdn()."""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid

from elastic.ids import uuid4_hex, uuid4_int, uuid4_str
from elastic.launcher.api import fqdn


def test_values_are_version_4_rfc_4122_uuids() -> None:
    seen = set()
    for _ in range(200):
        u = uuid.UUID(int=uuid4_int())
        assert u.version == 4
        assert u.variant == uuid.RFC_4122
        seen.add(u.int)
        s = uuid4_str()
        assert str(uuid.UUID(s)) == s and uuid.UUID(s).version == 4
        h = uuid4_hex()
        assert len(h) == 32 and uuid.UUID(hex=h).hex == h and uuid.UUID(hex=h).version == 4
    assert len(seen) == 200  # random, not a constant


def test_the_module_does_not_import_uuid() -> None:
    code = "import sys, elastic.ids; elastic.ids.uuid4_str(); print('uuid' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_fqdn_is_what_socket_getfqdn_gives_without_the_idna_codec() -> None:
    assert fqdn() == socket.getfqdn()
    code = (
        "import sys, elastic.launcher.api as a; print(a.fqdn()); "
        "print('encodings.idna' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    name, idna = out.stdout.split()
    assert (name, idna) == (socket.getfqdn(), "False"), out.stderr
