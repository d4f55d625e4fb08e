"""Configuration: the schemas every sweep is validated against, where things live, the run record."""
