"""``--runner DirectRunner``: Beam's DirectRunner without its attempt to run a graph on Prism.

Why: Beam's DirectRunner (2.77) first offers every graph that Prism supports to the Prism runner, a
Go binary it downloads from GitHub at run time (``urlopen`` with no timeout). Offline the download
fails, Beam falls back to its FnApiRunner (what runs the build anyway) and leaves an empty
``beam-temp*`` folder in the temp directory, one per pipeline; online it fetches the binary into
``~/.apache_beam/cache`` and runs the graph on a runner mmlinks never measured. mmlinks downloads
nothing at run time (README), so its DirectRunner goes straight to Beam's fallback: the FnApiRunner,
or the BundleBasedDirectRunner for a graph the FnApiRunner cannot run."""

from __future__ import annotations

from apache_beam.runners.direct import direct_runner as beam_direct

RUNNER_PATH = f"{__name__}.DirectRunner"  # what --runner names for Beam


class SwitchingDirectRunner(beam_direct.SwitchingDirectRunner):
    """Beam's DirectRunner that never tries Prism (module docstring).

    Beam skips Prism for an interactive pipeline and reads this flag nowhere else (2.77). The class
    keeps Beam's name: ``Pipeline.run`` skips its runner-API round trip (every transform pickled,
    the graph rebuilt from its proto) only for a runner of that name. tests/pipelines/
    test_direct_runner.py fails if a Beam upgrade changes either."""

    _is_interactive = True


DirectRunner = SwitchingDirectRunner  # as Beam names its own
