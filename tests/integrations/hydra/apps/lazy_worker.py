"""A host module the test app imports only inside its task (not at start-up)."""


class LazyGenerator:
    def generate(self, batch: object) -> str:
        return "live"
