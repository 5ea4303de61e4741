import json, sys
def load(f):
    d = json.load(open(f)); c = d['configs'][0]
    return {i['id']: (i['valid'], i['output']) for i in c['items']}
runs = [load(f) for f in sys.argv[1:]]
base = runs[0]
for f, r in zip(sys.argv[1:], runs):
    print(f, sum(v[0] for v in r.values()), 'identical to first', sum(r[k][1] == base[k][1] for k in r),
          'gained', sum(r[k][0] and not base[k][0] for k in r), 'lost', sum(base[k][0] and not r[k][0] for k in r))
