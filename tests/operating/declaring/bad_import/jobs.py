"""A jobs module that fails to import (system check tasks_coord.E006)."""

import tests.operating.declaring.no_such_module  # noqa: F401
