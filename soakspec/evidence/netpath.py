"""How the load generator reached a server, as the manifest records it: pure, no I/O.

The runner writes it (`runner/procs.py` `PortOwner.to_json`, the backend entry's
`port_listener`); `compare` reads it (`compare.network_path`). Both sides use this module, so
the runner's test of a loopback address and compare's are one function (`is_loopback`), and
the hop between load generator and server is a recorded fact (`port_listener.via`, one of
`VIAS`), not a phrase found in the human-readable `reason`.

`via` says what held the listening socket when the readiness probe passed:

- "server": a process of the launched server's tree (its own socket; `owner` "server");
- "forward": a container engine's port forward (docker-proxy, rootlessport, pasta, ...);
- "unseen": no socket listens on the port in soakspec's network namespace, though it answered
  (a published container port: a forward the kernel does, or another namespace's);
- "namespace": a process in another PID or mount namespace (`docker run --network host`);
- "unreadable": /proc does not show the holder (another user's process), or there is no /proc;
- "other": another process (the run aborts; written for completeness).

A port forward -- "forward" and "unseen" -- is a hop of its own on the network path: it adds
latency to every TTFT and latency (AIPerf PR #850). The others say nothing about the path.

Evidence from before `via` was recorded has the `reason` text only. `hop` reads it as that
soakspec's compare did -- a forward where the reason names one ("port forward": the runner's
FORWARDED_REASON; "forwarded port": its NO_LISTENER) -- so older evidence is compared as it
ran. That text match is for such evidence only: a manifest with `via` is read by `via` alone.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

VIAS = ("server", "forward", "unseen", "namespace", "unreadable", "other")
FORWARD_VIAS = frozenset({"forward", "unseen"})  # a hop of its own between load generator and server

OWN_SOCKET = "the launched server's own socket"
THROUGH_FORWARD = "through a port forward"

# what the runner's reason said of a forward before `via` was written (old evidence only)
_LEGACY_FORWARD_TEXT = ("port forward", "forwarded port")


def is_loopback(host: str) -> bool:
    """Whether `host` (a url's hostname, an address to bind) is this machine's loopback:
    "localhost" or a loopback address (127.0.0.0/8, ::1). A name other than localhost is not
    resolved: it is not loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def hop(port_listener: Mapping[str, Any]) -> str | None:
    """The hop a launched server's `port_listener` records between the load generator and the
    server: OWN_SOCKET, THROUGH_FORWARD, or None where it says neither (module doc)."""
    if port_listener.get("owner") == "server":
        return OWN_SOCKET
    via = port_listener.get("via")
    if isinstance(via, str):
        return THROUGH_FORWARD if via in FORWARD_VIAS else None
    why = port_listener.get("reason")  # evidence from before `via`: its reason text, read as it then was
    if isinstance(why, str) and any(t in why for t in _LEGACY_FORWARD_TEXT):
        return THROUGH_FORWARD
    return None
