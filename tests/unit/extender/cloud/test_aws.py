"""EC2's DescribeInstances answers in pages (NextToken); moto's server ignores MaxResults and answers
everything at once, so the end-to-end tests never see a second page. A small client standing in for EC2's
paging checks that listing by tag reads every page, asks for pages of PAGE, and stops at the last one."""

from __future__ import annotations

import asyncio
from typing import Any

from extender.cloud import aws
from extender.cloud.tags import TAG_CLAIM
from extender.cloud.vendor import VendorConfig


class PagingEC2:
    """Stands in for EC2's DescribeInstances: `total` instances in pages of the MaxResults asked for."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.calls: list[dict[str, Any]] = []

    async def describe_instances(self, **params: Any) -> dict[str, Any]:
        self.calls.append(dict(params))
        size = int(params.get("MaxResults") or 1000)
        start = int(params.get("NextToken") or 0)
        ids = range(start, min(start + size, self.total))
        page: dict[str, Any] = {
            "Reservations": [
                {
                    "Instances": [
                        {
                            "InstanceId": f"i-{n:05d}",
                            "State": {"Name": "running"},
                            "Tags": [{"Key": TAG_CLAIM, "Value": f"claim-{n}"}],
                        }
                        for n in ids
                    ]
                }
            ]
        }
        if start + size < self.total:
            page["NextToken"] = str(start + size)
        return page


def provider(ec2: PagingEC2) -> aws.AWSProvider:
    p = aws.AWSProvider(VendorConfig(type="aws", region="us-east-1"))
    p._client = ec2  # the client is built lazily; this one answers instead of EC2
    return p


def test_listing_by_tag_reads_every_page_in_pages_of_page() -> None:
    total = aws.PAGE * 2 + 7
    ec2 = PagingEC2(total)
    found = asyncio.run(provider(ec2).list_managed("prod"))
    assert [i.id for i in found] == [f"i-{n:05d}" for n in range(total)]
    assert [i.claim for i in found][-1] == f"claim-{total - 1}"
    assert len(ec2.calls) == 3
    assert all(c["MaxResults"] == aws.PAGE for c in ec2.calls)
    assert [c.get("NextToken") for c in ec2.calls] == [None, str(aws.PAGE), str(aws.PAGE * 2)]
    assert all(c["Filters"] == ec2.calls[0]["Filters"] for c in ec2.calls)


def test_one_page_is_one_call() -> None:
    ec2 = PagingEC2(3)
    assert len(asyncio.run(provider(ec2).list_managed("prod"))) == 3
    assert len(ec2.calls) == 1


def test_an_empty_listing_is_one_call_and_nothing() -> None:
    ec2 = PagingEC2(0)
    assert asyncio.run(provider(ec2).list_managed("prod")) == []
    assert len(ec2.calls) == 1
