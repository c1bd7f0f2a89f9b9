"""``meshctl cni``: the node installer of the chained CNI plugin (the plugin is ``cni_plugin``)."""
