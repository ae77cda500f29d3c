"""How attnlab shows things, whatever is shown: the rendering layer every other layer may use.

    display   results in the terminal (rich tables), as JSON and in Jupyter (HTML tables and
              heatmaps); tokens made visible (a space shows as ␣)
    plots     the one heatmap renderer behind every PNG (attention maps, confusion matrices,
              the interventions' tables, image overlays), and PNG writing
    images    a ViT's image as pixels, patches and a PNG ``data:`` URI

It knows nothing of models, tasks or runs: it draws arrays and labels it is given, and imports
nothing of attnlab's above it (a test walks the imports).
"""
