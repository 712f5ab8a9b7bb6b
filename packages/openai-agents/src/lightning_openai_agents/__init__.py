"""Lightning plugin (work in progress)."""

__all__: list[str] = []
