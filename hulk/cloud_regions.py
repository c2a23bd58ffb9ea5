"""Cloud regions of AWS, Google Cloud and Azure as places: code -> coordinates of its metro.

Source: each provider's public list of regions (AWS "Regions and Availability Zones", Google
Cloud "Regions and zones", Azure "Azure geographies" / the locations its CLI lists), which name
for every region a city, a metro or only a state or country. We typed the codes and the places
ourselves from those public lists (facts, not copied text); the coordinates are our own, of the
named metro, rounded to 0.01 degree. They are approximate: where a provider names only a state
or a country (AWS "Oregon", Azure "Virginia"), we took the area where the region's data
centres are publicly reported to be, which may be off by up to about 150 km. Where two
providers share a metro (Ashburn, Frankfurt, Dublin) the regions take the same point, so the
light-speed check (``hulk.geo.min_rtt_ms``) never asks more of a short link between them than
the distance between their metros. Regions as listed in late 2025; sovereign partitions (AWS
China, Azure China and Azure US Government) are included because users meet them too.

Names: ``PROVIDER:CODE`` (``aws:us-east-1``, ``gcp:us-central1``, ``azure:eastus``), trimmed and
case-insensitive; an Azure code may also be written as its display name (``azure:East US 2``).
A bare code (``us-east-1``, ``europe-west4``, ``eastus``) is accepted when exactly one provider
uses it; the three providers' code styles differ, so today every code is unambiguous.
"""

from __future__ import annotations

PROVIDERS: tuple[str, ...] = ("aws", "gcp", "azure")

# canonical name: (latitude, longitude, country code, the place the provider names)
REGIONS: dict[str, tuple[float, float, str, str]] = {
    # ---------------------------------------------------------------- AWS
    "aws:us-east-1": (39.04, -77.49, "US", "N. Virginia, Ashburn"),
    "aws:us-east-2": (39.96, -83.00, "US", "Ohio, Columbus"),
    "aws:us-west-1": (37.34, -121.89, "US", "N. California, San Jose"),
    "aws:us-west-2": (45.84, -119.70, "US", "Oregon, Boardman"),
    "aws:ca-central-1": (45.50, -73.57, "CA", "Canada Central, Montreal"),
    "aws:ca-west-1": (51.05, -114.07, "CA", "Calgary"),
    "aws:mx-central-1": (20.59, -100.39, "MX", "Mexico, Queretaro"),
    "aws:sa-east-1": (-23.55, -46.63, "BR", "Sao Paulo"),
    "aws:eu-west-1": (53.35, -6.26, "IE", "Ireland, Dublin"),
    "aws:eu-west-2": (51.51, -0.13, "GB", "London"),
    "aws:eu-west-3": (48.86, 2.35, "FR", "Paris"),
    "aws:eu-central-1": (50.11, 8.68, "DE", "Frankfurt"),
    "aws:eu-central-2": (47.38, 8.54, "CH", "Zurich"),
    "aws:eu-south-1": (45.46, 9.19, "IT", "Milan"),
    "aws:eu-south-2": (41.65, -0.89, "ES", "Spain, Aragon, Zaragoza"),
    "aws:eu-north-1": (59.33, 18.07, "SE", "Stockholm"),
    "aws:il-central-1": (32.09, 34.78, "IL", "Tel Aviv"),
    "aws:me-south-1": (26.23, 50.59, "BH", "Bahrain, Manama"),
    "aws:me-central-1": (25.20, 55.27, "AE", "UAE, Dubai"),
    "aws:af-south-1": (-33.92, 18.42, "ZA", "Cape Town"),
    "aws:ap-east-1": (22.32, 114.17, "HK", "Hong Kong"),
    "aws:ap-east-2": (25.03, 121.57, "TW", "Taipei"),
    "aws:ap-south-1": (19.08, 72.88, "IN", "Mumbai"),
    "aws:ap-south-2": (17.39, 78.49, "IN", "Hyderabad"),
    "aws:ap-southeast-1": (1.35, 103.82, "SG", "Singapore"),
    "aws:ap-southeast-2": (-33.87, 151.21, "AU", "Sydney"),
    "aws:ap-southeast-3": (-6.21, 106.85, "ID", "Jakarta"),
    "aws:ap-southeast-4": (-37.81, 144.96, "AU", "Melbourne"),
    "aws:ap-southeast-5": (3.14, 101.69, "MY", "Malaysia, Kuala Lumpur"),
    "aws:ap-southeast-6": (-36.85, 174.76, "NZ", "New Zealand, Auckland"),
    "aws:ap-southeast-7": (13.76, 100.50, "TH", "Thailand, Bangkok"),
    "aws:ap-northeast-1": (35.68, 139.69, "JP", "Tokyo"),
    "aws:ap-northeast-2": (37.57, 126.98, "KR", "Seoul"),
    "aws:ap-northeast-3": (34.69, 135.50, "JP", "Osaka"),
    "aws:cn-north-1": (39.90, 116.41, "CN", "Beijing"),
    "aws:cn-northwest-1": (37.50, 105.19, "CN", "Ningxia, Zhongwei"),
    # ---------------------------------------------------------------- Google Cloud
    "gcp:us-central1": (41.26, -95.86, "US", "Council Bluffs, Iowa"),
    "gcp:us-east1": (33.20, -80.01, "US", "Moncks Corner, South Carolina"),
    "gcp:us-east4": (39.04, -77.49, "US", "Ashburn, Virginia"),
    "gcp:us-east5": (39.96, -83.00, "US", "Columbus, Ohio"),
    "gcp:us-south1": (32.78, -96.80, "US", "Dallas, Texas"),
    "gcp:us-west1": (45.59, -121.18, "US", "The Dalles, Oregon"),
    "gcp:us-west2": (34.05, -118.24, "US", "Los Angeles"),
    "gcp:us-west3": (40.76, -111.89, "US", "Salt Lake City"),
    "gcp:us-west4": (36.17, -115.14, "US", "Las Vegas"),
    "gcp:northamerica-northeast1": (45.50, -73.57, "CA", "Montreal"),
    "gcp:northamerica-northeast2": (43.65, -79.38, "CA", "Toronto"),
    "gcp:northamerica-south1": (20.59, -100.39, "MX", "Queretaro"),
    "gcp:southamerica-east1": (-23.53, -46.79, "BR", "Osasco, Sao Paulo"),
    "gcp:southamerica-west1": (-33.45, -70.67, "CL", "Santiago"),
    "gcp:europe-west1": (50.45, 3.82, "BE", "St. Ghislain, Belgium"),
    "gcp:europe-west2": (51.51, -0.13, "GB", "London"),
    "gcp:europe-west3": (50.11, 8.68, "DE", "Frankfurt"),
    "gcp:europe-west4": (53.44, 6.83, "NL", "Eemshaven, Netherlands"),
    "gcp:europe-west6": (47.38, 8.54, "CH", "Zurich"),
    "gcp:europe-west8": (45.46, 9.19, "IT", "Milan"),
    "gcp:europe-west9": (48.86, 2.35, "FR", "Paris"),
    "gcp:europe-west10": (52.52, 13.40, "DE", "Berlin"),
    "gcp:europe-west12": (45.07, 7.69, "IT", "Turin"),
    "gcp:europe-central2": (52.23, 21.01, "PL", "Warsaw"),
    "gcp:europe-north1": (60.57, 27.20, "FI", "Hamina, Finland"),
    "gcp:europe-north2": (59.33, 18.07, "SE", "Stockholm"),
    "gcp:europe-southwest1": (40.42, -3.70, "ES", "Madrid"),
    "gcp:me-west1": (32.09, 34.78, "IL", "Tel Aviv"),
    "gcp:me-central1": (25.29, 51.53, "QA", "Doha"),
    "gcp:me-central2": (26.43, 50.10, "SA", "Dammam, Saudi Arabia"),
    "gcp:africa-south1": (-26.20, 28.05, "ZA", "Johannesburg"),
    "gcp:asia-east1": (24.08, 120.54, "TW", "Changhua County, Taiwan"),
    "gcp:asia-east2": (22.32, 114.17, "HK", "Hong Kong"),
    "gcp:asia-northeast1": (35.68, 139.69, "JP", "Tokyo"),
    "gcp:asia-northeast2": (34.69, 135.50, "JP", "Osaka"),
    "gcp:asia-northeast3": (37.57, 126.98, "KR", "Seoul"),
    "gcp:asia-south1": (19.08, 72.88, "IN", "Mumbai"),
    "gcp:asia-south2": (28.61, 77.21, "IN", "Delhi"),
    "gcp:asia-southeast1": (1.34, 103.71, "SG", "Jurong West, Singapore"),
    "gcp:asia-southeast2": (-6.21, 106.85, "ID", "Jakarta"),
    "gcp:australia-southeast1": (-33.87, 151.21, "AU", "Sydney"),
    "gcp:australia-southeast2": (-37.81, 144.96, "AU", "Melbourne"),
    # ---------------------------------------------------------------- Azure
    # East US: Azure names only "Virginia"; we take Northern Virginia (Ashburn), the nearer of the
    # candidate sites to the other Virginia regions, so a short link to them is never "too fast".
    "azure:eastus": (39.04, -77.49, "US", "Virginia"),
    "azure:eastus2": (36.67, -78.39, "US", "Virginia, Boydton"),
    "azure:centralus": (41.59, -93.62, "US", "Iowa, Des Moines"),
    "azure:northcentralus": (41.88, -87.63, "US", "Illinois, Chicago"),
    "azure:southcentralus": (29.42, -98.49, "US", "Texas, San Antonio"),
    "azure:westcentralus": (41.14, -104.82, "US", "Wyoming, Cheyenne"),
    "azure:westus": (37.77, -122.42, "US", "California, San Francisco"),
    "azure:westus2": (47.23, -119.85, "US", "Washington, Quincy"),
    "azure:westus3": (33.45, -112.07, "US", "Phoenix"),
    "azure:canadacentral": (43.65, -79.38, "CA", "Toronto"),
    "azure:canadaeast": (46.81, -71.21, "CA", "Quebec City"),
    "azure:mexicocentral": (20.59, -100.39, "MX", "Queretaro"),
    "azure:brazilsouth": (-23.55, -46.63, "BR", "Sao Paulo State"),
    "azure:brazilsoutheast": (-22.91, -43.17, "BR", "Rio de Janeiro"),
    "azure:chilecentral": (-33.45, -70.67, "CL", "Santiago"),
    "azure:northeurope": (53.35, -6.26, "IE", "Ireland, Dublin"),
    "azure:westeurope": (52.37, 4.90, "NL", "Netherlands, Amsterdam"),
    "azure:uksouth": (51.51, -0.13, "GB", "London"),
    "azure:ukwest": (51.48, -3.18, "GB", "Cardiff"),
    "azure:francecentral": (48.86, 2.35, "FR", "Paris"),
    "azure:francesouth": (43.30, 5.37, "FR", "Marseille"),
    "azure:germanywestcentral": (50.11, 8.68, "DE", "Frankfurt"),
    "azure:germanynorth": (52.52, 13.40, "DE", "Berlin"),
    "azure:switzerlandnorth": (47.38, 8.54, "CH", "Zurich"),
    "azure:switzerlandwest": (46.20, 6.14, "CH", "Geneva"),
    "azure:norwayeast": (59.91, 10.75, "NO", "Oslo"),
    "azure:norwaywest": (58.97, 5.73, "NO", "Stavanger"),
    "azure:swedencentral": (60.67, 17.14, "SE", "Gavle"),
    "azure:swedensouth": (55.60, 13.00, "SE", "Malmo"),
    "azure:polandcentral": (52.23, 21.01, "PL", "Warsaw"),
    "azure:italynorth": (45.46, 9.19, "IT", "Milan"),
    "azure:spaincentral": (40.42, -3.70, "ES", "Madrid"),
    "azure:uaenorth": (25.20, 55.27, "AE", "Dubai"),
    "azure:uaecentral": (24.45, 54.38, "AE", "Abu Dhabi"),
    "azure:qatarcentral": (25.29, 51.53, "QA", "Doha"),
    "azure:israelcentral": (32.09, 34.78, "IL", "Israel, Tel Aviv"),
    "azure:southafricanorth": (-26.20, 28.05, "ZA", "Johannesburg"),
    "azure:southafricawest": (-33.92, 18.42, "ZA", "Cape Town"),
    "azure:eastasia": (22.32, 114.17, "HK", "Hong Kong"),
    "azure:southeastasia": (1.35, 103.82, "SG", "Singapore"),
    "azure:japaneast": (35.68, 139.69, "JP", "Tokyo, Saitama"),
    "azure:japanwest": (34.69, 135.50, "JP", "Osaka"),
    "azure:koreacentral": (37.57, 126.98, "KR", "Seoul"),
    "azure:koreasouth": (35.18, 129.08, "KR", "Busan"),
    "azure:centralindia": (18.52, 73.86, "IN", "Pune"),
    "azure:southindia": (13.08, 80.27, "IN", "Chennai"),
    "azure:westindia": (19.08, 72.88, "IN", "Mumbai"),
    "azure:jioindiawest": (22.47, 70.06, "IN", "Jamnagar"),
    "azure:jioindiacentral": (21.15, 79.09, "IN", "Nagpur"),
    "azure:australiaeast": (-33.87, 151.21, "AU", "New South Wales, Sydney"),
    "azure:australiasoutheast": (-37.81, 144.96, "AU", "Victoria, Melbourne"),
    "azure:australiacentral": (-35.28, 149.13, "AU", "Canberra"),
    "azure:australiacentral2": (-35.28, 149.13, "AU", "Canberra"),
    "azure:newzealandnorth": (-36.85, 174.76, "NZ", "Auckland"),
    "azure:indonesiacentral": (-6.21, 106.85, "ID", "Jakarta"),
    "azure:malaysiawest": (3.14, 101.69, "MY", "Kuala Lumpur"),
    "azure:chinanorth": (39.90, 116.41, "CN", "Beijing"),
    "azure:chinanorth2": (39.90, 116.41, "CN", "Beijing"),
    "azure:chinanorth3": (38.04, 114.51, "CN", "Hebei"),
    "azure:chinaeast": (31.23, 121.47, "CN", "Shanghai"),
    "azure:chinaeast2": (31.23, 121.47, "CN", "Shanghai"),
    "azure:chinaeast3": (31.23, 121.47, "CN", "Shanghai"),
    "azure:usgovvirginia": (39.04, -77.49, "US", "US Gov Virginia"),
    "azure:usgovarizona": (33.45, -112.07, "US", "US Gov Arizona, Phoenix"),
    "azure:usgovtexas": (29.42, -98.49, "US", "US Gov Texas, San Antonio"),
}


def _bare_codes() -> dict[str, str]:
    """Code without its provider -> canonical name, for codes that only one provider uses."""
    seen: dict[str, list[str]] = {}
    for name in REGIONS:
        seen.setdefault(name.split(":", 1)[1], []).append(name)
    return {code: names[0] for code, names in seen.items() if len(names) == 1}


BARE_CODES: dict[str, str] = _bare_codes()


def canonical_region(name: str | None) -> str | None:
    """The canonical ``provider:code`` for ``name`` (prefixed or an unambiguous bare code, trimmed,
    case-insensitive), or None when it names no region we know."""
    if not name:
        return None
    key = name.strip().casefold()
    provider, sep, code = key.partition(":")
    if not sep:
        return BARE_CODES.get(key)
    code = code.strip()
    if provider == "azure":
        code = code.replace(" ", "")  # "East US 2" is how the portal shows eastus2
    canonical = f"{provider.strip()}:{code}"
    return canonical if canonical in REGIONS else None
