"""The ``landscape`` command-line tool: the application layer over ``landscape``, ``fl`` and ``figures``.

It lives outside ``landscape`` so that the analysis core never imports the FL engine or
the figures package.
"""
