"""_wsdb."""
