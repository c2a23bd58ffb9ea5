"""A small gazetteer of cities and cloud regions, and the physics of distance.

Coordinates are public facts (city centres, rounded to 0.01 degree). Names match case-insensitively
after trimming spaces, so the paper's "Neimeng " (trailing space) is Inner Mongolia (Hohhot).
Cloud regions (``aws:us-east-1``, ``gcp:europe-west4``, ``azure:westeurope``, or a bare code that
only one provider uses) are places too: their table and naming rules are in ``hulk.cloud_regions``.
A name is first looked up as a city, then as a region.
"""

from __future__ import annotations

import math

from hulk.cloud_regions import REGIONS, canonical_region

# name: (latitude, longitude, country code)
CITIES: dict[str, tuple[float, float, str]] = {
    # East Asia
    "Beijing": (39.90, 116.41, "CN"), "Shanghai": (31.23, 121.47, "CN"),
    "Nanjing": (32.06, 118.80, "CN"), "Quanzhou": (24.87, 118.68, "CN"),
    "Hohhot": (40.84, 111.75, "CN"), "Shenzhen": (22.54, 114.06, "CN"),
    "Guangzhou": (23.13, 113.26, "CN"), "Chengdu": (30.57, 104.07, "CN"),
    "Hangzhou": (30.27, 120.16, "CN"), "Wuhan": (30.59, 114.31, "CN"),
    "Xi'an": (34.34, 108.94, "CN"), "Hong Kong": (22.32, 114.17, "HK"),
    "Taipei": (25.03, 121.57, "TW"), "Tokyo": (35.68, 139.69, "JP"),
    "Osaka": (34.69, 135.50, "JP"), "Seoul": (37.57, 126.98, "KR"),
    # South and South-East Asia, Oceania
    "New Delhi": (28.61, 77.21, "IN"), "Mumbai": (19.08, 72.88, "IN"),
    "Bangalore": (12.97, 77.59, "IN"), "Singapore": (1.35, 103.82, "SG"),
    "Jakarta": (-6.21, 106.85, "ID"), "Bangkok": (13.76, 100.50, "TH"),
    "Sydney": (-33.87, 151.21, "AU"), "Melbourne": (-37.81, 144.96, "AU"),
    "Auckland": (-36.85, 174.76, "NZ"),
    # Middle East, Africa
    "Dubai": (25.20, 55.27, "AE"), "Tel Aviv": (32.09, 34.78, "IL"),
    "Riyadh": (24.71, 46.68, "SA"), "Johannesburg": (-26.20, 28.05, "ZA"),
    "Cape Town": (-33.92, 18.42, "ZA"), "Lagos": (6.52, 3.38, "NG"),
    "Nairobi": (-1.29, 36.82, "KE"), "Cairo": (30.04, 31.24, "EG"),
    # Europe
    "London": (51.51, -0.13, "GB"), "Paris": (48.86, 2.35, "FR"),
    "Berlin": (52.52, 13.40, "DE"), "Frankfurt": (50.11, 8.68, "DE"),
    "Munich": (48.14, 11.58, "DE"), "Rome": (41.90, 12.50, "IT"),
    "Milan": (45.46, 9.19, "IT"), "Madrid": (40.42, -3.70, "ES"),
    "Barcelona": (41.39, 2.17, "ES"), "Lisbon": (38.72, -9.14, "PT"),
    "Amsterdam": (52.37, 4.90, "NL"), "Brussels": (50.85, 4.35, "BE"),
    "Zurich": (47.38, 8.54, "CH"), "Vienna": (48.21, 16.37, "AT"),
    "Stockholm": (59.33, 18.07, "SE"), "Oslo": (59.91, 10.75, "NO"),
    "Helsinki": (60.17, 24.94, "FI"), "Copenhagen": (55.68, 12.57, "DK"),
    "Dublin": (53.35, -6.26, "IE"), "Warsaw": (52.23, 21.01, "PL"),
    "Prague": (50.08, 14.44, "CZ"), "Istanbul": (41.01, 28.98, "TR"),
    "Moscow": (55.76, 37.62, "RU"),
    # Americas
    "California": (37.34, -121.89, "US"),  # the paper's "California": San Jose, Silicon Valley
    "San Francisco": (37.77, -122.42, "US"), "Los Angeles": (34.05, -118.24, "US"),
    "Seattle": (47.61, -122.33, "US"), "Portland": (45.52, -122.68, "US"),
    "Dallas": (32.78, -96.80, "US"), "Chicago": (41.88, -87.63, "US"),
    "New York": (40.71, -74.01, "US"), "Ashburn": (39.04, -77.49, "US"),
    "Atlanta": (33.75, -84.39, "US"), "Miami": (25.76, -80.19, "US"),
    "Denver": (39.74, -104.99, "US"), "Toronto": (43.65, -79.38, "CA"),
    "Montreal": (45.50, -73.57, "CA"), "Vancouver": (49.28, -123.12, "CA"),
    "Mexico City": (19.43, -99.13, "MX"), "Bogota": (4.71, -74.07, "CO"),
    "Lima": (-12.05, -77.04, "PE"), "Santiago": (-33.45, -70.67, "CL"),
    "Buenos Aires": (-34.60, -58.38, "AR"), "Sao Paulo": (-23.55, -46.63, "BR"),
    "Brasilia": (-15.79, -47.88, "BR"),
}

ALIASES: dict[str, str] = {
    "neimeng": "Hohhot", "inner mongolia": "Hohhot", "nei mongol": "Hohhot",
    "delhi": "New Delhi", "silicon valley": "California", "san jose": "California",
    "são paulo": "Sao Paulo", "xian": "Xi'an", "bengaluru": "Bangalore",
}

_BY_KEY = {name.casefold(): name for name in CITIES}

EARTH_RADIUS_KM = 6371.0
# Light in fibre covers about 200 km per ms, so a round trip costs at least 1 ms per 100 km.
KM_PER_MS_RTT = 100.0


def canonical_city(name: str | None) -> str | None:
    """The gazetteer's name for ``name`` (trimmed, case-insensitive, aliases; a cloud region's
    canonical ``provider:code``), or None if unknown."""
    if not name:
        return None
    key = name.strip().casefold()
    if key in ALIASES:
        return ALIASES[key]
    return _BY_KEY.get(key) or canonical_region(key)


def place(name: str | None) -> tuple[float, float, str] | None:
    """(latitude, longitude, country code) of a city or cloud region, or None if unknown."""
    known = canonical_city(name)
    if known is None:
        return None
    if known in CITIES:
        return CITIES[known]
    lat, lon, country, _ = REGIONS[known]
    return lat, lon, country


def coordinates(name: str | None) -> tuple[float, float] | None:
    """(latitude, longitude) of a city or cloud region, or None if unknown."""
    where = place(name)
    return None if where is None else where[:2]


def region_label(name: str | None) -> str | None:
    """A cloud region as a person reads it, its canonical code and the place its provider names
    (``aws:us-east-1 (N. Virginia, Ashburn)``); None for a city or an unknown name."""
    known = canonical_city(name)
    if known is None or known in CITIES:
        return None
    return f"{known} ({REGIONS[known][3]})"


def great_circle_km(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Haversine distance in km between two (lat, lon) points in degrees."""
    lat1, lon1 = map(math.radians, a)
    lat2, lon2 = map(math.radians, b)
    h = (math.sin((lat2 - lat1) / 2) ** 2
         + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2)
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))


def min_rtt_ms(a: tuple[float, float] | None, b: tuple[float, float] | None) -> float:
    """The speed-of-light lower bound on RTT between two points; 0 when either is unknown."""
    if a is None or b is None:
        return 0.0
    return great_circle_km(a, b) / KM_PER_MS_RTT
