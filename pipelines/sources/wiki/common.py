"""What both wiki modes share: the source name, the modes, and the per-document sentence bound."""

from __future__ import annotations

SOURCE = "wiki"
MODES = ("imageclef", "mediawiki")
# Emit every sentence (the build's filter keeps the first 100) but never hold more than this.
HARD_MAX_SENTENCES = 1000
