"""Token-targeting methods: ``base.py`` (the Method interface), ``registry.py`` (methods by name) and one module per
method. The registry imports every other module of this package (``methods.registry.registered_methods``), so a
new method is a new module here, with no line to add in this file."""
