"""Install as data: values and their schema, components, the rendered manifest, readiness,
drift and ownership rules. Pure: no cluster access here (the install plugin applies)."""
