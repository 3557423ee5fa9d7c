"""Dataset builds with Apache Beam: the config, the graph, its stages, the sources and the web client."""
