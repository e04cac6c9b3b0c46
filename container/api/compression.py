"""HTTP content codings on V2 infer, as Triton has them: a gzip or deflate request body (tritonclient's
`request_compression_algorithm`) is inflated within the body limit, and an answer is compressed when
`Accept-Encoding` asks for gzip or deflate. "deflate" is the zlib format, as HTTP defines it."""

import zlib

from container.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType

_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def inflate(body: bytes, coding: str | None, limit: int) -> bytes:
    """The body without its Content-Encoding; a body that inflates past `limit` bytes is refused."""
    coding = (coding or "identity").strip().lower()
    if coding == "identity":
        return body
    if coding not in _WBITS:
        raise UnsupportedMediaType(f"Content-Encoding {coding[:40]!r} is not supported; use gzip or deflate")
    inflater = zlib.decompressobj(_WBITS[coding])
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidRequest(f"the body is not valid {coding} data: {exc}") from None
    if len(data) > limit:
        raise PayloadTooLarge(f"the body inflates past {limit} bytes (SAGEMAKER_MAX_PAYLOAD_IN_MB)")
    if not inflater.eof:
        raise InvalidRequest(f"the {coding} body ends before its compressed stream does")
    return data


def negotiate(accept_encoding: str | None) -> str | None:
    """The coding to answer in: gzip or deflate, whichever `Accept-Encoding` weighs highest; None for
    none (identity)."""
    if not accept_encoding:
        return None
    best, best_q = None, 0.0
    for item in accept_encoding.split(","):
        coding, *params = [part.strip() for part in item.split(";")]
        q = next((_weight(p[2:]) for p in params if p.lower().startswith("q=")), 1.0)
        coding = "gzip" if coding == "*" else coding.lower()
        if coding in _WBITS and q > best_q:
            best, best_q = coding, q
    return best


def deflate(body: bytes, coding: str) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, _WBITS[coding])
    return compressor.compress(body) + compressor.flush()


def _weight(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0
