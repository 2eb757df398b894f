"""Reports: aggregates kept in exports, figures as data, inline-SVG HTML and PNG renderers."""
