"""Codec work big enough to be felt runs on a native thread, not on the event loop: decoding a 6 MiB
body or writing 1.5 M values as text takes seconds of pure Python, and on the loop every other
request (`/ping` included) would wait that long. The thread still holds the GIL, but Python hands it
back to the loop every 5 ms (`sys.getswitchinterval()`). Small bodies stay on the loop: a thread
hand-off costs more than their whole decode."""

import gevent

from container.v2.documents import heavy as heavy  # the one threshold, which the gRPC front-ends read too
from container.v2.documents import heavy_outputs


def run(is_heavy: bool, function, *args):
    """`function(*args)`, on the hub's thread pool when `is_heavy`."""
    if is_heavy:
        return gevent.get_hub().threadpool.apply(function, args)
    return function(*args)


def encode(function, outputs: dict, *args):
    """`function(outputs, *args)`, on a thread when the outputs are large."""
    return run(heavy_outputs(outputs), function, outputs, *args)
