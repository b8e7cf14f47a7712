"""Tools around the library: benchmarks (`bench`), traces of a generation (`trace`), plugin scaffolding and
installs (`plugin_tools`, `templates`), the demo, progress bars, and the test helpers plugin authors use
(`testing`, `tiny_models`). Layer 5 of docs/architecture.md: they import the layers below, the command line imports
them.
"""
