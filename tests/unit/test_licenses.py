import pytest

from pipelines.core.licenses import normalize_license


@pytest.mark.parametrize(
    ("raw", "code", "group"),
    [
        ("CC BY", "CC BY", "commercial"),
        ("CC0", "CC0", "commercial"),
        ("CC BY-SA", "CC BY-SA", "commercial"),
        ("CC BY-ND", "CC BY-ND", "commercial"),
        ("CC BY-NC", "CC BY-NC", "noncommercial"),
        ("CC BY-NC-SA", "CC BY-NC-SA", "noncommercial"),
        ("CC BY-NC-ND", "CC BY-NC-ND", "noncommercial"),
        ("NO-CC CODE", "NO-CC CODE", "other"),
        ("cc-by-4.0", "CC BY", "commercial"),
        ("CC-BY-NC 4.0", "CC BY-NC", "noncommercial"),
        ("http://creativecommons.org/licenses/by-nc-nd/4.0/", "CC BY-NC-ND", "noncommercial"),
        ("https://creativecommons.org/publicdomain/zero/1.0/", "CC0", "commercial"),
        ("http://creativecommons.org/publicdomain/mark/1.0/", "PDM", "other"),
    ],
)
def test_known_licenses(raw, code, group):
    lic = normalize_license(raw)
    assert (lic.code, lic.group, lic.warning) == (code, group, None)


@pytest.mark.parametrize("raw", ["Elsevier user license", "CC BY-XYZ", "GPL"])
def test_unknown_license_is_other_with_a_readable_warning(raw):
    lic = normalize_license(raw)
    assert lic.code is None and lic.group == "other"
    assert raw in lic.warning and "unknown license" in lic.warning


def test_missing_license():
    assert normalize_license("").warning == "no license string"
