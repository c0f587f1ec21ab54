"""Children of a DisaggregatedModel, as plain dicts ready for server-side apply.

Pure functions: same input, same output, no API calls. Names are deterministic
(`<name>-prefill`, `<name>-decode`, `<name>-router`), so re-applying after a crash or a
restart updates the same objects instead of creating duplicates. `children.render_children`
lists every child; `kinds` is the table of the kinds they may be.
"""
