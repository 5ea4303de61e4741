import json,re,ast
from sglang_pask.bfcl.data import load_items
d=json.load(open('diag.json'))
items={i.id:i for i in load_items()}
recs=[]
for l in open('relevance_scores.log'):
    m=re.search(r"seq=(\d+) group=(\d+) mean=(\[.*?\]) max=(\[.*?\]) sum=(\[.*?\])",l)
    if m: recs.append((int(m[2]),ast.literal_eval(m[3])))
res=d['configs'][0]['items']
stats={g:{'hit':0,'chance':0.0,'first':0,'last':0,'n':0} for g in range(4)}
for k,r in enumerate(res):
    it=items[r['id']]; names=[f['name'] for f in it.functions]
    gt={names.index(g) for c in it.ground_truth for g in c if g in names}
    for g,mean in recs[4*k:4*k+4]:
        top=max(range(len(mean)),key=lambda j:mean[j]); s=stats[g]
        s['n']+=1; s['hit']+=top in gt; s['chance']+=len(gt)/len(mean); s['first']+=top==0; s['last']+=top==len(mean)-1
for g,s in stats.items():
    print(f"| {g} | {s['n']} | {s['hit']} | {s['chance']:.1f} | {s['first']} | {s['last']} |")
