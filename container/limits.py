"""What one request or one model may cost, checked before the cost is paid. Each refusal names the
setting to raise. The rules that follow from the platform rather than from taste are constants."""

from dataclasses import dataclass

from container.errors import InsufficientMemory, InvalidModel, InvalidRequest, PayloadTooLarge

MAX_NAME_BYTES = 255  # a model name may become a directory name: NAME_MAX on every Linux file system
MAX_DIMS = 32  # numpy refuses more than 64; no served model takes more than a handful
MAX_JSON_NESTING = 100  # Triton's HTTP_MAX_JSON_NESTING_DEPTH: V2 "data" may nest this deep whatever its shape


@dataclass(frozen=True)
class Limits:
    decoded_bytes: int = 256 << 20  # one request's input tensors, decoded
    archive_bytes: int = 16 << 30  # what one archive may expand to
    archive_members: int = 10_000
    archive_depth: int = 32  # path components of one archive member
    instances: int = 64  # instance_group counts of one model, summed
    priority_levels: int = 64
    total_instances: int = 1024  # instance threads of every model loaded, together

    def check_decoded(self, size: int, what: str = "the request's tensors") -> None:
        if size > self.decoded_bytes:
            raise PayloadTooLarge(
                f"{what} decode to {size} bytes; the limit is {self.decoded_bytes} (SERVE_MAX_DECODED_SIZE)")

    def check_model(self, instances: int, levels: int) -> None:
        """The instances and priority levels a model's config asks for: each instance is a thread, each
        level a queue."""
        if instances > self.instances:
            raise InvalidModel(f"instance_group asks for {instances} instances; at most {self.instances} "
                               f"(SERVE_MAX_INSTANCES)")
        if levels > self.priority_levels:
            raise InvalidModel(f"dynamic_batching asks for {levels} priority levels; at most {self.priority_levels} "
                               f"(SERVE_MAX_PRIORITY_LEVELS)")


    def check_total_instances(self, running: int, wanted: int) -> None:
        if running + wanted > self.total_instances:
            raise InsufficientMemory(f"the models loaded run {running} instance threads; {wanted} more would pass "
                                     f"{self.total_instances} (SERVE_MAX_TOTAL_INSTANCES): unload a model first")


def too_deep(name: str, limit: int = MAX_DIMS) -> str:
    """Values nested deeper than `limit`, in Triton's words: a tensor's dimensions where the nesting is
    its shape, MAX_JSON_NESTING for V2 data, whose shape is given beside it."""
    return f"JSON nesting depth exceeds maximum allowed limit ({limit}): the values of input '{name}' nest deeper"


def check_name(name) -> str:
    """The one rule for model names, in every API: 1–255 UTF-8 bytes, no '/', '\\' or control
    characters, and not '.' or '..' (a name may become a path under the server's directories)."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidRequest("a model name must be a non-empty string")
    if len(name.encode(errors="surrogatepass")) > MAX_NAME_BYTES:
        raise InvalidRequest(f"a model name may hold at most {MAX_NAME_BYTES} bytes; this one holds {len(name.encode(errors='surrogatepass'))}")
    if "/" in name or "\\" in name or name in (".", "..") or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise InvalidRequest(f"model name {name[:80]!r} may not hold '/', '\\' or control characters, nor be '.' or '..'")
    return name


def boolean(text: str) -> bool | None:
    """`text` as a switch (true/false, 1/0, yes/no, on/off, any case), else None."""
    return {"1": True, "true": True, "yes": True, "on": True,
            "0": False, "false": False, "no": False, "off": False}.get(text.strip().lower())


def whole_number(text: str) -> int | None:
    """`text` as a non-negative integer written in ASCII digits, else None (`'²'.isdigit()` is true)."""
    if text and text.isascii() and text.isdigit():
        return int(text)
    return None
