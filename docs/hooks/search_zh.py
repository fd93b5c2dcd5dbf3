"""MkDocs hook: Chinese search that finds and highlights whole terms.

Chinese is written without spaces, so a search index that splits text at whitespace keeps a
whole Chinese sentence (or table cell) as one "word": a query such as 参数服务器 then matches
nothing, or a whole section, with nothing to highlight. Material's search plugin segments
Chinese text into words with jieba when jieba is installed (``_segment_chinese`` in
material/plugins/search/plugin.py), putting a zero-width space (U+200B) between the words;
the site's search ``separator`` (mkdocs.yml) includes U+200B, so those words become the
index's terms, and the theme's highlighter finds each term between separators.

jieba's dictionary does not know every term of this field (参数服务器 would come out as
参数 + 服务器, and a query for the whole term would miss). So this hook adds every Chinese
term of the glossary (docs/glossary.md, the single table of terms) to jieba's dictionary
before any page is indexed: a term of the glossary is always one word of the index.
"""
from __future__ import annotations

import re
from pathlib import Path

# A Chinese cell of the glossary: <span lang="zh-Hans">term</span>, perhaps "term（English）"
# or several terms separated by 、 / ；
_CELL = re.compile(r'<span lang="zh-Hans">([^<]+)</span>')
_HAN_RUN = re.compile(r"[\u4e00-\u9fff]+")


def glossary_terms(glossary: Path) -> list[str]:
    """Every run of Chinese characters in the glossary's Chinese cells, in order, once."""
    terms: dict[str, None] = {}
    for cell in _CELL.findall(glossary.read_text(encoding="utf-8")):
        for run in _HAN_RUN.findall(cell):
            if len(run) > 1:
                terms[run] = None
    return list(terms)


def on_config(config):
    try:
        import jieba
    except ImportError:  # Material indexes Chinese unsegmented then; the docs extra installs jieba
        return config
    jieba.setLogLevel(60)  # no "Building prefix dict..." lines in the build's output
    for term in glossary_terms(Path(config["docs_dir"]) / "glossary.md"):
        jieba.add_word(term)
    return config
