"""Z85 (ZeroMQ RFC 32) written from the spec: the oracle the deletion-vector tests encode with,
independent of the code under test."""

from __future__ import annotations

Z85_CHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def z85_encode(data: bytes) -> str:
    """ZeroMQ RFC 32: each big-endian 4-byte group becomes 5 base-85 digits, most significant first."""
    assert len(data) % 4 == 0
    out: list[str] = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i : i + 4], "big")
        digits = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            digits.append(Z85_CHARS[digit])
        out.extend(reversed(digits))
    return "".join(out)
