"""A tiny host application with each kind of Ray worker skipweave must reach (no skipweave import)."""
