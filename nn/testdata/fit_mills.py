"""Fits the Mills ratio R(t) = Q(t)/phi(t) of the standard normal on [k, k+1),
k = 0..11, by degree-8 polynomials in t - k - 0.5 (least squares on Chebyshev
nodes, math.erfc as the truth): the table of nn/fastmath.go.

Run: /usr/bin/python3 nn/testdata/fit_mills.py
"""
import numpy as np, math
def R(t):  # Mills ratio Q(t)/phi(t)
    return 0.5*math.erfc(t/math.sqrt(2)) / (math.exp(-t*t/2)/math.sqrt(2*math.pi))
deg = 8
out = []
worst = 0
for k in range(12):
    a, b = k, k+1
    c = (a+b)/2
    # Chebyshev nodes
    n = 200
    xs = c + 0.5*np.cos(np.pi*(np.arange(n)+0.5)/n)
    ys = np.array([R(x) for x in xs])
    p = np.polynomial.chebyshev.Chebyshev.fit(xs - c, ys, deg, domain=[-0.5, 0.5])
    coef = p.convert(kind=np.polynomial.Polynomial).coef
    test = np.linspace(a, b, 2001)
    err = max(abs(np.polyval(coef[::-1], t - c) - R(t))/R(t) for t in test)
    worst = max(worst, err)
    out.append(coef)
print("worst rel", worst)
for coef in out:
    print("\t{" + ", ".join(repr(float(v)) for v in coef) + "},")
