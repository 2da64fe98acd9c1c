"""mmencode's HTTP service: routes, scheduler, worker, caches and integrations."""
