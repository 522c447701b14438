"""``python -m parlab.glossary > docs/glossary.md``."""

import sys

from parlab.glossary import render_markdown

sys.stdout.write(render_markdown())
