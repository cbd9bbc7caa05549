"""Helpers shared by the test packages (see tests/conftest.py): real `tuner` processes, the tests' PostgreSQL, the
compose file, and the one builder of stored sample studies."""
