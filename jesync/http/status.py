"""(Being written: see L{jesync.http}.)"""

from __future__ import annotations

from typing import List

from jesync.http.api import Route

ROUTES: List[Route] = []
