//! Where AWS is for a region: its partition (`aws`, `aws-cn`, `aws-us-gov`), the EC2 and STS
//! endpoints there, and a check that a configured endpoint and the signing region agree
//! (a request signed for one region and sent to another's endpoint is refused by AWS with a
//! message that does not say so).

/// Why a region, or a configured endpoint with it, cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "{0:?} is not an AWS region name (like us-east-1, cn-north-1 or us-gov-west-1): check provision.ec2.region or AWS_REGION"
    )]
    Region(String),
    #[error(
        "the endpoint {endpoint} is in {} but the region {region} is in partition {partition}: set provision.ec2.region to the endpoint's region, or drop provision.ec2.endpoint",
        if *.endpoint_in_cn { "aws-cn" } else { "the aws or aws-us-gov partition" }
    )]
    OtherPartition {
        endpoint: String,
        endpoint_in_cn: bool,
        region: String,
        partition: &'static str,
    },
    #[error(
        "the endpoint {endpoint} is for region {named} but requests would be signed for {region}: set provision.ec2.region = \"{named}\", or drop provision.ec2.endpoint"
    )]
    OtherRegion {
        endpoint: String,
        named: String,
        region: String,
    },
}

/// An AWS partition: a set of regions sharing a DNS suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// `aws`, `aws-cn` or `aws-us-gov` (as in ARNs).
    pub id: &'static str,
    pub dns_suffix: &'static str,
}

const AWS: Partition = Partition {
    id: "aws",
    dns_suffix: "amazonaws.com",
};
const AWS_CN: Partition = Partition {
    id: "aws-cn",
    dns_suffix: "amazonaws.com.cn",
};
const AWS_US_GOV: Partition = Partition {
    id: "aws-us-gov",
    dns_suffix: "amazonaws.com",
};

/// `PREFIX-WORD-DIGITS`, e.g. `eu-west-1`, `ap-southeast-2`, `us-gov-west-1`.
fn region_shape(region: &str, prefix: &str) -> bool {
    let Some(rest) = region
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('-'))
    else {
        return false;
    };
    let Some((word, digits)) = rest.rsplit_once('-') else {
        return false;
    };
    !word.is_empty()
        && word.chars().all(|c| c.is_ascii_lowercase() || c == '-')
        && !digits.is_empty()
        && digits.chars().all(|c| c.is_ascii_digit())
}

/// The partition a region is in (the patterns of the SDKs' partition table).
pub fn partition(region: &str) -> Result<Partition, Error> {
    if region_shape(region, "us-gov") {
        return Ok(AWS_US_GOV);
    }
    if region_shape(region, "cn") {
        return Ok(AWS_CN);
    }
    const COMMERCIAL: [&str; 9] = ["us", "eu", "ap", "sa", "ca", "me", "af", "il", "mx"];
    if COMMERCIAL.iter().any(|p| region_shape(region, p)) {
        return Ok(AWS);
    }
    Err(Error::Region(region.to_string()))
}

/// `https://SERVICE.REGION.SUFFIX/`.
pub fn service_url(service: &str, region: &str) -> Result<String, Error> {
    let p = partition(region)?;
    Ok(format!("https://{service}.{region}.{}/", p.dns_suffix))
}

/// The region an AWS hostname names (`ec2.eu-west-1.amazonaws.com`,
/// `vpce-1.ec2.us-east-1.vpce.amazonaws.com`, `ec2.cn-north-1.amazonaws.com.cn`), if any.
fn region_in_host(host: &str) -> Option<&str> {
    let head = host
        .strip_suffix(".amazonaws.com.cn")
        .or_else(|| host.strip_suffix(".amazonaws.com"))?;
    head.split('.').find(|label| partition(label).is_ok())
}

/// Checks that `endpoint` (a configured URL) and `region` (what requests are signed for)
/// agree where the endpoint is AWS's own; other endpoints (an emulator, a proxy) are taken
/// as they are.
pub fn check_agree(endpoint: &str, region: &str) -> Result<(), Error> {
    let partition = partition(region)?;
    let host = endpoint
        .split_once("://")
        .map(|(_, rest)| rest)
        .unwrap_or(endpoint)
        .split(['/', ':'])
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let aws_cn = host.ends_with(".amazonaws.com.cn");
    let aws = aws_cn || host.ends_with(".amazonaws.com");
    if !aws {
        return Ok(());
    }
    if aws_cn != (partition == AWS_CN) {
        return Err(Error::OtherPartition {
            endpoint: endpoint.to_string(),
            endpoint_in_cn: aws_cn,
            region: region.to_string(),
            partition: partition.id,
        });
    }
    match region_in_host(&host) {
        Some(r) if r != region => Err(Error::OtherRegion {
            endpoint: endpoint.to_string(),
            named: r.to_string(),
            region: region.to_string(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_map_to_their_partition_and_endpoints() {
        for (region, id, ec2) in [
            ("us-east-1", "aws", "https://ec2.us-east-1.amazonaws.com/"),
            (
                "ap-southeast-2",
                "aws",
                "https://ec2.ap-southeast-2.amazonaws.com/",
            ),
            (
                "il-central-1",
                "aws",
                "https://ec2.il-central-1.amazonaws.com/",
            ),
            (
                "cn-north-1",
                "aws-cn",
                "https://ec2.cn-north-1.amazonaws.com.cn/",
            ),
            (
                "cn-northwest-1",
                "aws-cn",
                "https://ec2.cn-northwest-1.amazonaws.com.cn/",
            ),
            (
                "us-gov-west-1",
                "aws-us-gov",
                "https://ec2.us-gov-west-1.amazonaws.com/",
            ),
        ] {
            assert_eq!(partition(region).unwrap().id, id, "{region}");
            assert_eq!(service_url("ec2", region).unwrap(), ec2);
        }
        assert_eq!(
            service_url("sts", "cn-north-1").unwrap(),
            "https://sts.cn-north-1.amazonaws.com.cn/"
        );
        for bad in [
            "",
            "useast1",
            "us-east",
            "xx-west-1",
            "us-east-1a",
            "US-EAST-1",
        ] {
            let e = partition(bad).unwrap_err().to_string();
            assert!(e.contains("not an AWS region"), "{bad}: {e}");
        }
    }

    #[test]
    fn an_endpoint_for_another_region_or_partition_is_refused() {
        check_agree("https://ec2.us-east-1.amazonaws.com/", "us-east-1").unwrap();
        check_agree("http://127.0.0.1:5000", "eu-west-1").unwrap();
        check_agree(
            "https://vpce-0abc.ec2.eu-west-1.vpce.amazonaws.com",
            "eu-west-1",
        )
        .unwrap();
        let e = check_agree("https://ec2.eu-west-1.amazonaws.com", "us-east-1")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("for region eu-west-1") && e.contains("signed for us-east-1"),
            "{e}"
        );
        let e = check_agree("https://ec2.cn-north-1.amazonaws.com.cn", "us-east-1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("aws-cn"), "{e}");
        let e = check_agree("https://ec2.us-east-1.amazonaws.com", "cn-north-1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("partition aws-cn"), "{e}");
        // GovCloud and commercial share a suffix; the region in the host still tells.
        let e = check_agree("https://ec2.us-gov-west-1.amazonaws.com", "us-east-1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("us-gov-west-1"), "{e}");
    }
}
