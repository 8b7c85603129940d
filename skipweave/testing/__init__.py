"""skipweave for test suites: golden-recording tests (docs/ci.md).

- :mod:`skipweave.testing.pytest_plugin`: the pytest plugin (registered through the ``pytest11`` entry point: nothing
  to import): ``@pytest.mark.skipweave(...)``, ``--skipweave-mode`` and the ``skipweave_summary`` fixture. It stays
  tiny, because every pytest session of an environment with skipweave installed imports it.
- :mod:`skipweave.testing.golden`: what the plugin does for one marked test (compose the plan of the mode, weave,
  judge, unweave, bless a new recording), imported only when a test asks for it.

Like the Hydra callback and ``skipweave run``, this package is an assembling entry point: it may load the integrations
(through :func:`skipweave.weave`); no generic layer imports it.
"""
