"""The codec's one exception type."""

from __future__ import annotations


class DecodeError(ValueError):
    """A frame (or a nested payload) that cannot be decoded.

    Carries where it happened so that a finding can point at the byte: the API key and version
    (``None`` when the header itself is unreadable), the byte ``offset`` into the buffer that was
    being decoded, and a human-readable ``reason``.
    """

    def __init__(
        self,
        reason: str,
        offset: int = 0,
        api_key: int | None = None,
        api_version: int | None = None,
        what: str | None = None,
    ) -> None:
        self.reason = reason
        self.offset = offset
        self.api_key = api_key
        self.api_version = api_version
        self.what = what
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.what:
            where.append(self.what)
        if self.api_key is not None:
            where.append(f"api_key={self.api_key}")
        if self.api_version is not None:
            where.append(f"v{self.api_version}")
        prefix = " ".join(where)
        return f"{prefix + ': ' if prefix else ''}{self.reason} (at byte {self.offset})"

    def located(self, api_key: int | None, api_version: int | None, what: str | None = None) -> DecodeError:
        """The same error, annotated with the API it happened in (keeps the innermost location)."""
        return DecodeError(
            self.reason,
            self.offset,
            self.api_key if self.api_key is not None else api_key,
            self.api_version if self.api_version is not None else api_version,
            self.what or what,
        )

    def locate(self, api_key: int | None, api_version: int | None, what: str | None = None) -> DecodeError:
        """Like :meth:`located`, but annotates this error in place.

        Re-raising the same object (a bare ``raise``) keeps its traceback, so the frames of the
        generated decoder where the read failed stay visible in tracebacks and debuggers.
        """
        if self.api_key is None:
            self.api_key = api_key
        if self.api_version is None:
            self.api_version = api_version
        self.what = self.what or what
        self.args = (self._render(),)
        return self

    def __reduce__(self) -> tuple[type[DecodeError], tuple[str, int, int | None, int | None, str | None]]:
        return (DecodeError, (self.reason, self.offset, self.api_key, self.api_version, self.what))
