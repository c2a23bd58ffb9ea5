"""The fleet dashboard of `hulk-planner serve --dashboard HOST:PORT`: a read-only web page.

``view``: the store's values turned into the JSON the page reads (pure); ``compare``: the methods'
makespans for the jobs of the last plan, computed off the store's thread; ``snapshot``: the
periodic read of the store that keeps both current; ``server``: the HTTP(S) server with its
token check; ``static/``: the page itself (HTML, JS and CSS, no external resources).
"""
