"""mmencode: an HTTP service that turns images into vision-encoder embeddings."""

__version__ = "0.1.0"
