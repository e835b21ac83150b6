"""What a transport knows about its connection that the supervisor reports (health, errors)."""

from __future__ import annotations


class TransportState:
    """Mutable, owned by one supervisor; transports fill it in as they learn things."""

    __slots__ = ("closing_reason", "pid", "ready", "returncode")

    def __init__(self) -> None:
        self.pid: int | None = None
        """The stdio child's process id while it runs."""
        self.returncode: int | None = None
        """The stdio child's exit status once it has exited."""
        self.closing_reason: str | None = None
        """Why the transport ended the connection, when it knows better than "closed"."""
        self.ready = False
        """The server completed its startup: it has earned a graceful shutdown."""

    def reset(self) -> None:
        self.pid = self.returncode = None
        self.closing_reason = None
        self.ready = False
