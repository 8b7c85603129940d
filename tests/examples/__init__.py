"""End-to-end tests of the example jobs in examples/."""
