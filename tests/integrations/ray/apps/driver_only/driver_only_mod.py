"""A module on the driver's ``sys.path`` only (the driver inserts its folder), as hosts often do by hand."""


class Helper:
    """A driver-side helper that is also a target."""

    def run(self, x: int) -> int:
        return x + 1
