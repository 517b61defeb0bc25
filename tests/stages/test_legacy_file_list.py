"""The legacy ``oa_file_list.csv`` parser over a real excerpt, plus malformed rows."""

from pathlib import Path

from pipelines.acquire.layouts import parse_legacy_file_list

DATA = Path(__file__).parents[1] / "data" / "oa_file_list.headerless_sample.csv"


def test_real_excerpt_parses_completely():
    records, problems = parse_legacy_file_list(DATA.read_bytes())
    assert problems == []
    assert len(records) == 270  # `wc -l`
    by_code = {}
    for r in records:
        by_code[r.license_code] = by_code.get(r.license_code, 0) + 1
    assert by_code == {"NO-CC CODE": 195, "CC BY": 60, "CC0": 15}  # `awk -F, '{print $NF}' | uniq -c`
    assert sum(r.pmid is None for r in records) == 70  # `awk -F, '$5==""'`
    first = records[0]
    assert (first.pmcid, first.pmid, first.source_paths) == (
        "PMC13900",
        "11250746",
        ["oa_package/08/e0/PMC13900.tar.gz"],
    )
    assert first.citation == "Breast Cancer Res. 2001 Nov 2; 3(1):55-60"
    assert first.last_updated.isoformat() == "2019-11-05T11:56:12+00:00"
    assert first.license_group == "other" and first.version is None and first.retracted is False
    pmc48154 = next(r for r in records if r.pmcid == "PMC48154")
    assert pmc48154.pmid is None and pmc48154.warning is None


def test_malformed_rows_are_reported_and_the_rest_kept():
    header = b"File,Article Citation,Accession ID,Last Updated (YYYY-MM-DD HH:MM:SS),PMID,License,Retracted\n"
    body = (
        b"oa_package/08/e0/PMC13900.tar.gz,Cit A,PMC13900,2019-11-05 11:56:12,11250746,CC BY,no\n"
        b"oa_package/08/e0/PMC1.tar.gz,Cit B,PMC1,2019-11-05,1,CC BY,no\n"  # bad timestamp
        b"oa_package/08/e0/PMC2.tar.gz,Cit C,PMCX2,2019-11-05 11:56:12,1,CC BY,no\n"  # bad accession
        b"oa_package/08/e0/PMC3.tar.gz,Cit D,PMC4,2019-11-05 11:56:12,1,CC BY,no\n"  # path/id mismatch
        b"just,three,fields\n"
        b"oa_package/aa/bb/PMC5.tar.gz,Cit E,PMC5,2020-01-01 00:00:00,,Some Custom License,yes\n"
        b"oa_package/aa/bb/PMC6.tar.gz,Cit F,PMC6,2020-01-01 00:00:00,12x,CC BY-NC,no\n"
    )
    records, problems = parse_legacy_file_list(header + body)
    assert [r.pmcid for r in records] == ["PMC13900", "PMC5", "PMC6"]
    assert [p.location for p in problems] == [f"oa_file_list.csv:{n}" for n in (3, 4, 5, 6)]
    assert [p.error for p in problems] == [
        "malformed Last Updated timestamp",
        "malformed accession id 'PMCX2'",
        "package path 'oa_package/08/e0/PMC3.tar.gz' does not match PMC4",
        "expected 7 fields, got 3",
    ]
    pmc5, pmc6 = records[1], records[2]
    assert pmc5.retracted is True and pmc5.pmid is None
    assert pmc5.license_group == "other" and "unknown license string 'Some Custom License'" in pmc5.warning
    assert pmc6.pmid is None and "malformed PMID '12x'" in pmc6.warning and pmc6.license_group == "noncommercial"
