"""Browser tests: a package, so that the browser fixtures (package scope) end with them."""
