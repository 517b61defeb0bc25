"""The PMC Cloud metadata JSON reader: the one place that knows its field names."""

import json

import pytest

from pipelines.acquire.layouts import parse_cloud_metadata

GOOD = {
    "pmcid": "PMC7302504",
    "version": 2,
    "pmid": "32555654",
    "doi": "10.1371/journal.pone.0234687",
    "license_code": "CC0",
    "is_retracted": False,
    "last_updated": "2026-01-15T00:00:00Z",
    "xml_url": "s3://pmc-oa-opendata/PMC7302504.2/PMC7302504.2.xml",
    "media_urls": ["https://pmc-oa-opendata.s3.amazonaws.com/PMC7302504.2/pone.0234687.g001.jpg"],
    "md5": {"PMC7302504.2.xml": "aa" * 16},
    "some_future_field": {"ignored": True},
}


def test_good_metadata():
    record = parse_cloud_metadata(json.dumps(GOOD).encode(), "PMC7302504", 2)
    assert record.source_paths == ["PMC7302504.2/PMC7302504.2.xml", "PMC7302504.2/pone.0234687.g001.jpg"]
    assert record.source_md5 == ["aa" * 16, None]
    assert (record.license_code, record.license_group, record.pmid) == ("CC0", "commercial", "32555654")
    assert record.last_updated.isoformat() == "2026-01-15T00:00:00+00:00"


@pytest.mark.parametrize("field", ["pmcid", "version", "license_code", "is_retracted", "xml_url", "media_urls"])
def test_missing_required_field_names_it(field):
    meta = {k: v for k, v in GOOD.items() if k != field}
    with pytest.raises(ValueError, match=f"metadata JSON missing field '{field}'"):
        parse_cloud_metadata(json.dumps(meta).encode(), "PMC7302504", 2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": "2"}, "field 'version' should be int, got str"),
        ({"is_retracted": "no"}, "field 'is_retracted' should be bool"),
        ({"media_urls": "a.jpg"}, "field 'media_urls' should be list"),
        ({"pmcid": "PMC1"}, "describes PMC1.2 but lives under PMC7302504.2"),
        ({"media_urls": ["s3://pmc-oa-opendata/PMC9.1/x.jpg"]}, "outside the article prefix"),
        ({"last_updated": "yesterday"}, "not an ISO timestamp"),
        ({"md5": ["x"]}, "'md5' should be an object"),
    ],
)
def test_surprises_fail_clearly(change, message):
    with pytest.raises(ValueError, match=message):
        parse_cloud_metadata(json.dumps({**GOOD, **change}).encode(), "PMC7302504", 2)


def test_not_json():
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_cloud_metadata(b"<Error>AccessDenied</Error>", "PMC7302504", 2)
