"""The human loop: the review page (``ubi review serve``) over the review queue."""
